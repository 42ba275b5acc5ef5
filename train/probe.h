// `cgspn probe CONFIG --weights W`: how good an encoder's features are on Fashion-MNIST.
#pragma once

int cmd_probe(int argc, char **argv);
