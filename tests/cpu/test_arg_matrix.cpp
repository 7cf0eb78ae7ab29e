// The argument-validation matrix, CPU part (issue 12). Rows: tests/common/arg_rows/*.cpp; the
// machinery: tests/common/arg_matrix.h. Runs in CI without a GPU (FLAME_CUDA_DRIVER_PATH points at
// nothing), through libflame.so as a user links it:
//  - coverage: the flame_* functions exported by the loaded libflame.so, read from its ELF dynamic
//    symbol table at run time, and the rows are the same set, so a new function without a row fails;
//  - each nullable pointer argument NULL (other pointers valid, handles garbage): the function's
//    name in the message, FLAME_ERROR_INVALID_ARGUMENT naming that argument, or, where the function
//    looks at a handle first, FLAME_ERROR_INVALID_HANDLE naming that handle (the GPU matrix then
//    checks the argument with live handles); OUT handles NULL afterwards;
//  - every handle garbage: FLAME_ERROR_INVALID_HANDLE naming one of them, OUT handles NULL;
//  - the void release functions take NULL (and garbage tensor / context handles) and do nothing;
//  - functions without pointer arguments hold their checks for out-of-range values.
#include <dlfcn.h>
#include <elf.h>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include "arg_matrix.h"
#include "flame_test.h"

namespace {

const bool g_no_driver = [] {  // as test_abi.cpp: no driver in this process, whatever the machine has
  setenv("FLAME_CUDA_DRIVER_PATH", "/nonexistent/libcuda.so.1", 1);
  return true;
}();

// The defined, global flame_* functions in the dynamic symbol table of the library that holds
// flame_abi_version (the one this test is linked against).
std::set<std::string> exported_functions(std::string* where) {
  Dl_info info;
  std::set<std::string> names;
  if (!dladdr(reinterpret_cast<void*>(&flame_abi_version), &info) || !info.dli_fname) return names;
  *where = info.dli_fname;
  std::ifstream f(info.dli_fname, std::ios::binary);
  std::string d((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (d.size() < sizeof(Elf64_Ehdr) || d.compare(0, 4, ELFMAG) != 0 || d[EI_CLASS] != ELFCLASS64) return names;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(d.data());
  if (eh->e_shoff + static_cast<size_t>(eh->e_shnum) * sizeof(Elf64_Shdr) > d.size()) return names;
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(d.data() + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& strtab = sh[sh[i].sh_link];
    if (sh[i].sh_offset + sh[i].sh_size > d.size() || strtab.sh_offset + strtab.sh_size > d.size()) return names;
    const auto* sym = reinterpret_cast<const Elf64_Sym*>(d.data() + sh[i].sh_offset);
    for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
      if (sym[k].st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC ||
          ELF64_ST_BIND(sym[k].st_info) != STB_GLOBAL || sym[k].st_name >= strtab.sh_size)
        continue;
      std::string n(d.data() + strtab.sh_offset + sym[k].st_name);
      if (n.compare(0, 6, "flame_") == 0) names.insert(n);
    }
  }
  return names;
}

// Whether msg (after the function-name prefix) names `name` as a whole word.
bool names_word(const std::string& msg, const std::string& name) {
  size_t colon = msg.find(": ");
  const std::string body = colon == std::string::npos ? msg : msg.substr(colon + 2);
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t p = body.find(name); p != std::string::npos; p = body.find(name, p + 1)) {
    size_t e = p + name.size();
    if ((p == 0 || !word(body[p - 1])) && (e == body.size() || !word(body[e]))) return true;
  }
  return false;
}

std::string status_name(flame_status_t s) { return flame_status_string(s); }

TEST(ArgMatrix, EveryExportedFunctionHasARow) {
  ASSERT_TRUE(g_no_driver);
  std::string lib;
  std::set<std::string> exported = exported_functions(&lib);
  ASSERT_GT(exported.size(), 100u) << "could not read the exported functions of " << lib;
  std::set<std::string> rows;
  for (const argm::Row& r : argm::registry()) {
    EXPECT_TRUE(rows.insert(r.name).second) << "two rows for " << r.name << " (" << r.file << ":" << r.line << ")";
  }
  for (const std::string& f : exported)
    EXPECT_TRUE(rows.count(f)) << f << " is exported by " << lib
                               << " but has no row: add one to tests/common/arg_rows/<topic>.cpp";
  for (const std::string& r : rows)
    EXPECT_TRUE(exported.count(r)) << "row " << r << " names a function " << lib << " does not export";
  std::printf("[ArgMatrix] %zu exported functions, %zu rows\n", exported.size(), rows.size());
}

TEST(ArgMatrix, NullPointersAreRejectedNamingTheArgument) {
  size_t strict = 0, deferred = 0, total = 0;
  for (const argm::Row& r : argm::registry()) {
    if (r.kind != argm::Kind::Status) continue;
    argm::Args probe(argm::Mode::Probe);
    r.call(probe);
    probe.finish(FLAME_ERROR_INVALID_ARGUMENT);
    const std::vector<std::string> nullable = probe.nullable_names();
    std::set<std::string> handle_names;
    for (const argm::ArgInfo& h : probe.handles()) handle_names.insert(h.name);
    for (size_t k = 0; k < nullable.size(); ++k) {
      SCOPED_TRACE(r.name + "(" + nullable[k] + " = NULL)");
      argm::Args a(argm::Mode::Cpu);
      a.null_at = static_cast<int>(k);
      flame_status_t st = r.call(a);
      const std::string msg = flame_last_error_message();
      ++total;
      EXPECT_NE(msg.find(r.name), std::string::npos) << "the message names the function: \"" << msg << "\"";
      bool named_handle = false;
      for (const std::string& h : handle_names) named_handle |= names_word(msg, h);
      if (st == FLAME_ERROR_INVALID_ARGUMENT && names_word(msg, nullable[k])) {
        ++strict;
      } else if (st == FLAME_ERROR_INVALID_HANDLE && named_handle) {
        ++deferred;  // a handle is checked first; the GPU matrix checks this argument
      } else {
        ADD_FAILURE() << "got " << status_name(st) << " \"" << msg << "\": expected FLAME_ERROR_INVALID_ARGUMENT naming "
                      << nullable[k];
      }
      for (const std::string& o : a.uncleared_outs()) ADD_FAILURE() << "OUT " << o << " not set to NULL on failure";
      a.finish(st);
    }
  }
  std::printf("[ArgMatrix] %zu NULL arguments: %zu named as the argument, %zu after a garbage handle (GPU checks)\n",
              total, strict, deferred);
  EXPECT_GT(strict, total / 2);
}

TEST(ArgMatrix, GarbageHandlesAreRejected) {
  size_t n = 0;
  for (const argm::Row& r : argm::registry()) {
    if (r.kind != argm::Kind::Status) continue;
    argm::Args probe(argm::Mode::Probe);
    r.call(probe);
    probe.finish(FLAME_ERROR_INVALID_ARGUMENT);
    const std::vector<argm::ArgInfo> handles = probe.handles();
    if (handles.empty()) continue;
    SCOPED_TRACE(r.name + " with garbage handles");
    argm::Args a(argm::Mode::Cpu);
    flame_status_t st = r.call(a);
    const std::string msg = flame_last_error_message();
    bool named = false;
    for (const argm::ArgInfo& h : handles) named |= names_word(msg, h.name);
    EXPECT_EQ(st, FLAME_ERROR_INVALID_HANDLE) << status_name(st) << " \"" << msg << "\"";
    EXPECT_TRUE(named) << "the message names the handle: \"" << msg << "\"";
    EXPECT_NE(msg.find(r.name), std::string::npos) << msg;
    for (const std::string& o : a.uncleared_outs()) ADD_FAILURE() << "OUT " << o << " not set to NULL on failure";
    a.finish(st);
    ++n;
  }
  std::printf("[ArgMatrix] %zu functions reject garbage handles\n", n);
}

TEST(ArgMatrix, ReleaseFunctionsTakeNullAndGarbage) {
  for (const argm::Row& r : argm::registry()) {
    if (r.kind != argm::Kind::Void) continue;
    SCOPED_TRACE(r.name);
    argm::Args null_args(argm::Mode::Cpu);
    null_args.null_at = 0;
    EXPECT_EQ(r.call(null_args), FLAME_OK);
    null_args.finish(FLAME_OK);
    argm::Args garbage(argm::Mode::Cpu);  // garbage tensor / context handles; hooks are never garbage
    EXPECT_EQ(r.call(garbage), FLAME_OK);
    garbage.finish(FLAME_OK);
  }
}

TEST(ArgMatrix, PureFunctionsHoldTheirChecks) {
  for (const argm::Row& r : argm::registry()) {
    if (r.kind != argm::Kind::Pure) continue;
    argm::Args a(argm::Mode::Cpu);
    EXPECT_EQ(r.call(a), FLAME_OK) << r.name << " (" << r.file << ":" << r.line << ")";
    a.finish(FLAME_OK);
  }
}

}  // namespace
