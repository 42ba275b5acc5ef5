// `cgspn bench NAME...`: the op, block and step benchmarks (GPU builds).
#pragma once
int cmd_bench(int argc, char **argv);
