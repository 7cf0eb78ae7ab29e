/*
 * example_args.h - the command line of every example: one table of options per program (name,
 * type, where the value goes, help), parsed here, so that all examples answer --help and --version
 * the same way and name the argument that is wrong.
 *
 *   static const example_arg args[] = {
 *       {"--steps", ARG_INT, &cfg.steps, "N", "training steps", 1, 0, NULL},
 *       {"--lr", ARG_POSITIVE_DOUBLE, &cfg.lr, "LR", "peak learning rate", 0, 0, NULL}};
 *   const example_cli cli = {"train_mlp", "trains an MLP ...", args, 2, NULL};
 *   int rc = example_parse_args(&cli, argc, argv);
 *   if (rc != EXAMPLE_ARGS_RUN) return rc;
 *
 * Each option's variable holds its default before the call; --help prints those values. Results:
 * EXAMPLE_ARGS_RUN (go on), 0 after --help (usage on stdout) or --version, 1 after a bad argument
 * (one line on stderr: "train_mlp: --steps: expected a positive integer, got 'abc'"). Nothing here
 * touches the GPU: examples parse before they create a context, so --help works on any machine.
 * Checks that involve several options (--heads dividing --dim) stay in the example and report
 * through example_arg_fail in the same form. Plain C99; every function is static inline so that a
 * program that does not use one gets no warning.
 */
#ifndef FLAME_EXAMPLE_ARGS_H
#define FLAME_EXAMPLE_ARGS_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flame.h"

typedef enum example_arg_type {
  ARG_INT,             /* int* in [min, max] (max 0: no upper bound) */
  ARG_U64,             /* uint64_t*, any unsigned decimal (seeds) */
  ARG_DOUBLE,          /* double*, any finite number */
  ARG_POSITIVE_DOUBLE, /* double*, finite and > 0 */
  ARG_FRACTION,        /* double*, in [0, 1) */
  ARG_STRING,          /* const char**, any text (a path); points into argv */
  ARG_FLAG             /* int*, no value: set to 1 */
} example_arg_type;

typedef struct example_arg {
  const char* name;          /* "--steps" */
  example_arg_type type;
  void* value;               /* see example_arg_type; holds the default before parsing */
  const char* meta;          /* the value's placeholder in the usage ("N"); NULL for flags */
  const char* help;          /* one line */
  long min, max;             /* ARG_INT only */
  const char* default_text;  /* NULL: the variable's value; else shown instead ("2, or 1 with one GPU") */
} example_arg;

typedef struct example_cli {
  const char* program;     /* "train_mlp": the prefix of every message */
  const char* summary;     /* one line under the usage */
  const example_arg* args;
  int count;
  const char* notes;       /* NULL or further lines for --help (exit status, examples) */
} example_cli;

#define EXAMPLE_ARGS_RUN (-1)

/* Prints "program: name: <formatted text>" on stderr and returns 1 (the exit status of a bad argument). */
static inline int example_arg_fail(const example_cli* cli, const char* name, const char* fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: %s: ", cli->program, name);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (%s --help lists the options)\n", cli->program);
  return 1;
}

static inline const example_arg* example_arg_find(const example_cli* cli, const char* name) {
  int i;
  for (i = 0; i < cli->count; ++i)
    if (!strcmp(cli->args[i].name, name)) return &cli->args[i];
  return NULL;
}

/* Writes the default of a into buf (its variable's value before parsing). */
static inline void example_arg_default(const example_arg* a, char* buf, size_t size) {
  if (a->default_text) {
    snprintf(buf, size, "%s", a->default_text);
    return;
  }
  switch (a->type) {
    case ARG_INT: snprintf(buf, size, "%d", *(const int*)a->value); break;
    case ARG_U64: snprintf(buf, size, "%llu", (unsigned long long)*(const uint64_t*)a->value); break;
    case ARG_DOUBLE:
    case ARG_POSITIVE_DOUBLE:
    case ARG_FRACTION: snprintf(buf, size, "%g", *(const double*)a->value); break;
    case ARG_STRING: {
      const char* s = *(const char* const*)a->value;
      snprintf(buf, size, "%s", s ? s : "none");
      break;
    }
    case ARG_FLAG: snprintf(buf, size, "%s", *(const int*)a->value ? "on" : "off"); break;
  }
}

static inline void example_usage(const example_cli* cli, FILE* out) {
  int i;
  char left[64], def[512];
  fprintf(out, "usage: %s [OPTIONS]\n%s\n\noptions:\n", cli->program, cli->summary);
  for (i = 0; i < cli->count; ++i) {
    const example_arg* a = &cli->args[i];
    snprintf(left, sizeof left, "%s%s%s", a->name, a->meta ? " " : "", a->meta ? a->meta : "");
    example_arg_default(a, def, sizeof def);
    fprintf(out, "  %-22s %s (default: %s)\n", left, a->help, def);
  }
  fprintf(out, "  %-22s %s\n", "--help", "print this help and exit");
  fprintf(out, "  %-22s %s\n", "--version", "print the program's and FLAME's versions and exit");
  if (cli->notes) fprintf(out, "\n%s\n", cli->notes);
}

/* Parses text into a's variable; 0 on success, else 1 after naming a->name and the value. */
static inline int example_arg_set(const example_cli* cli, const example_arg* a, const char* text) {
  char* end = NULL;
  errno = 0;
  switch (a->type) {
    case ARG_INT: {
      long v = strtol(text, &end, 10);
      long hi = a->max ? a->max : INT_MAX;
      if (end == text || *end || errno == ERANGE || v < a->min || v > hi) {
        if (a->min == 1 && !a->max) return example_arg_fail(cli, a->name, "expected a positive integer, got '%s'", text);
        if (!a->max) return example_arg_fail(cli, a->name, "expected an integer >= %ld, got '%s'", a->min, text);
        return example_arg_fail(cli, a->name, "expected an integer in [%ld, %ld], got '%s'", a->min, hi, text);
      }
      *(int*)a->value = (int)v;
      return 0;
    }
    case ARG_U64: {
      unsigned long long v = strtoull(text, &end, 10);
      if (end == text || *end || errno == ERANGE || text[0] == '-')
        return example_arg_fail(cli, a->name, "expected an unsigned integer, got '%s'", text);
      *(uint64_t*)a->value = (uint64_t)v;
      return 0;
    }
    case ARG_DOUBLE:
    case ARG_POSITIVE_DOUBLE:
    case ARG_FRACTION: {
      double v = strtod(text, &end);
      int ok = end != text && !*end && errno != ERANGE && isfinite(v);
      if (a->type == ARG_POSITIVE_DOUBLE) ok = ok && v > 0;
      if (a->type == ARG_FRACTION) ok = ok && v >= 0 && v < 1;
      if (!ok) {
        const char* what = a->type == ARG_POSITIVE_DOUBLE ? "a positive number"
                           : a->type == ARG_FRACTION     ? "a number in [0, 1)"
                                                         : "a number";
        return example_arg_fail(cli, a->name, "expected %s, got '%s'", what, text);
      }
      *(double*)a->value = v;
      return 0;
    }
    case ARG_STRING:
      if (!*text) return example_arg_fail(cli, a->name, "expected %s, got an empty string", a->meta ? a->meta : "a value");
      *(const char**)a->value = text;
      return 0;
    case ARG_FLAG:
      *(int*)a->value = 1;
      return 0;
  }
  return 1;
}

/* --help or --version anywhere among the options answers first, with the defaults unchanged. */
static inline int example_answer_help(const example_cli* cli, int argc, char** argv) {
  int i;
  for (i = 1; i < argc; ++i) {
    const example_arg* a;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      example_usage(cli, stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--version")) {
      printf("%s (FLAME %s, ABI %d)\n", cli->program, flame_version_string(), (int)flame_abi_version());
      return 0;
    }
    a = example_arg_find(cli, argv[i]);
    if (!a) break; /* reported by the parse */
    if (a->type != ARG_FLAG) ++i;
  }
  return EXAMPLE_ARGS_RUN;
}

/* See the top of the file. */
static inline int example_parse_args(const example_cli* cli, int argc, char** argv) {
  int i, rc = example_answer_help(cli, argc, argv);
  if (rc != EXAMPLE_ARGS_RUN) return rc;
  for (i = 1; i < argc; ++i) {
    const example_arg* a = example_arg_find(cli, argv[i]);
    if (!a) {
      fprintf(stderr, "%s: unknown option '%s' (%s --help lists the options)\n", cli->program, argv[i], cli->program);
      return 1;
    }
    if (a->type == ARG_FLAG) {
      example_arg_set(cli, a, "");
      continue;
    }
    if (i + 1 >= argc) return example_arg_fail(cli, a->name, "expected a value (%s) after it", a->meta);
    if (example_arg_set(cli, a, argv[++i])) return 1;
  }
  return EXAMPLE_ARGS_RUN;
}

#endif /* FLAME_EXAMPLE_ARGS_H */
