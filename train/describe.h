// `cgspn describe CONFIG`: an encoder's layout, parameters and MACs (train/describe.c).
#pragma once

int cmd_describe(int argc, char **argv);
