// `cgspn describe CONFIG`: the encoder a config builds, without data or weights: its layout,
// parameters (total and trainable) and multiply-accumulates per image at img_size, then each
// parameter tensor with --params. What the README's model tables quote.
#include "cli_args.h"
#include "describe.h"
#include "model_config.h"
#include "../kernels/error.h"

static void describe_usage(FILE *f) {
    fprintf(f,
        "usage: cgspn describe CONFIG [--params] [--key=value ...]\n"
        "Prints the encoder of CONFIG: layout, parameters and GMACs per image at img_size\n"
        "(convolutions, linears, depthwise convolutions and the scan; norms and activations are\n"
        "not counted, as fvcore counts the papers' GMACs). --params lists every tensor.\n"
        "Example: cgspn describe configs/gspn_t.cfg\n");
}

int cmd_describe(int argc, char **argv) {
    if (cli_wants_help(argc, argv, 2)) {
        describe_usage(stdout);
        return 0;
    }
    bool list = cli_take_switch(&argc, argv, 2, "--params");
    Config c;
    config_defaults(&c);
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn describe --help", "unexpected argument '%s'", argv[2]);
    EncoderConfig ecfg = encoder_config_from(&c);
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ecfg, &params);   // shapes only: nothing is allocated
    encoder_describe(&enc, &params, stdout);
    if (list)
        for (int i = 0; i < params.n; i++) {
            const Param *p = params.params[i];
            char shape[64];
            printf("  %-48s %-20s %s\n", p->name, tensor_shape_str(&p->value, shape, sizeof shape),
                   p->trainable ? "" : "(frozen)");
        }
    params_free(&params, NULL);   // nothing allocated: the metadata alone
    return 0;
}
