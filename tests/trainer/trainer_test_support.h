// What flame-train's CPU and GPU tests share, with no codec and no GPU: a temporary folder that
// removes itself, a text file writer, command lines for the configuration, the problem matcher of
// ConfigError lists, running the flame-train program through the shell, reading its JSONL log, and
// reading a safetensors file's F32 / BF16 tensors on the host.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.h"

namespace flame_train_test {

// A folder under $TMPDIR (or /tmp), removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/flame_train_test_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// parse_command_line over {"flame-train", args...}.
inline flame_train::CommandLine command_line(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"flame-train"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<const char*> argv;
  for (const auto& a : all) argv.push_back(a.c_str());
  return flame_train::parse_command_line(static_cast<int>(argv.size()), argv.data());
}

// The problems load_config reports for a command line (empty when it succeeds).
inline std::vector<std::string> config_problems(const std::vector<std::string>& args) {
  try {
    flame_train::load_config(command_line(args));
    return {};
  } catch (const flame_train::ConfigError& e) {
    return e.problems();
  }
}

inline ::testing::AssertionResult has_problem(const std::vector<std::string>& problems, const std::string& fragment) {
  for (const auto& p : problems)
    if (p.find(fragment) != std::string::npos) return ::testing::AssertionSuccess();
  std::string all;
  for (const auto& p : problems) all += "\n  " + p;
  return ::testing::AssertionFailure() << "no problem contains '" << fragment << "'; problems:" << all;
}

// A shell command's exit status (-1 when it did not exit normally) and its stdout (add 2>&1 to the
// command for stderr too).
struct ProgramRun {
  int status = -1;
  std::string output;
};

inline ProgramRun run_shell(const std::string& cmd) {
  ProgramRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The (step, loss) pairs of a flame-train JSONL log, in order.
inline std::vector<std::pair<int64_t, double>> logged_losses(const std::string& path) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>());
  }
  return out;
}

// The tensors of a safetensors file on the host as float (F32 or BF16), with their dtypes.
struct HostTensors {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::string> dtypes;
  std::string error;
};

inline HostTensors read_host_tensors(const std::string& path) {
  HostTensors t;
  const std::string bytes = read_bytes(path);
  uint64_t header_size = 0;
  if (bytes.size() >= 8) std::memcpy(&header_size, bytes.data(), 8);
  if (bytes.size() < 8 || 8 + header_size > bytes.size()) {
    t.error = path + ": not a safetensors file (too short)";
    return t;
  }
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size));
  const char* data = bytes.data() + 8 + header_size;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string dtype = it.value().at("dtype").get<std::string>();
    const size_t begin = it.value().at("data_offsets")[0].get<size_t>(), end = it.value().at("data_offsets")[1].get<size_t>();
    std::vector<float>& v = t.values[it.key()];
    t.dtypes[it.key()] = dtype;
    if (dtype == "F32") {
      v.resize((end - begin) / 4);
      std::memcpy(v.data(), data + begin, end - begin);
    } else if (dtype == "BF16") {
      v.resize((end - begin) / 2);
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t h = 0;
        std::memcpy(&h, data + begin + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&v[i], &bits, 4);
      }
    } else {
      t.error = path + ": " + it.key() + " has dtype " + dtype + " (the test reads F32 and BF16)";
    }
  }
  return t;
}

}  // namespace flame_train_test
