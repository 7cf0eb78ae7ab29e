// Prints the row-kernel router's decision for every case of tests/data/row_routing.txt (see
// row_routing_cases.h), the table test_row_router.cpp checks:
//
//   build/tests/cpu/flame_row_routing_dump > tests/data/row_routing.txt
#include <cstdio>
#include "row_routing_cases.h"

int main() {
  for (const std::string& line : flame::row_routing::routing_lines()) std::printf("%s\n", line.c_str());
  return 0;
}
