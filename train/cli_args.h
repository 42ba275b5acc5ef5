// Command flags that are not config keys (paths such as --weights W), taken out of argv before
// the config parser sees the rest.
#pragma once
#include <stdbool.h>

// Finds "--name VALUE" or "--name=VALUE" in argv[first..*argc-1], removes it from argv and
// returns VALUE (NULL when absent). A flag given without a value is an error naming it.
const char *cli_take_flag(int *argc, char **argv, int first, const char *name);
// A switch: "--name" alone (true) or "--name=0|1", removed from argv; false when absent. Another
// value is an error naming the switch.
bool cli_take_switch(int *argc, char **argv, int first, const char *name);
// Whether --help or -h is among argv[first..argc-1].
int cli_wants_help(int argc, char **argv, int first);
