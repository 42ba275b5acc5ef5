#include "export.h"
#include "checkpoint.h"
#include "cli_args.h"
#include "distill.h"
#include "../kernels/error.h"
#include "../nn/safetensors.h"
#include <sys/stat.h>

static void export_usage(FILE *f) {
    fprintf(f, "usage: cgspn export CKPT --out student.safetensors [--ema]\n"
               "Writes the student of CKPT (a checkpoint folder, a run folder: its newest complete\n"
               "checkpoint, or a safetensors file) without the distillation adaptors (adaptors.*)\n"
               "and without optimizer state: timm names, PyTorch layouts, the checkpoint's dtypes;\n"
               "loads with safetensors.torch.load_file. The model keys are in CKPT's config.cfg.\n"
               "--ema writes the EMA of the weights instead (fp32; the checkpoint of a run trained\n"
               "with ema_decay > 0): the weights ImageNet results are reported with.\n");
}

// The weights' checkpoint folder, or "" when ckpt is a file; -1 with a message on error.
static int checkpoint_dir(const char *ckpt, char *dir, size_t dn, char *err, size_t n) {
    struct stat sb;
    dir[0] = 0;
    if (stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode))
        return ckpt_resolve_err(ckpt, "", dir, dn, err, n) < 0 ? -1 : 0;
    return 0;
}

int export_student_err(const char *ckpt, const char *out, bool ema, int *kept, int *dropped,
                       char *err, size_t n) {
    char dir[1024], path[1200], state_path[1200];
    if (checkpoint_dir(ckpt, dir, sizeof dir, err, n) != 0) return -1;
    if (ema && !dir[0]) {
        snprintf(err, n, "%s: --ema reads the EMA weights of a checkpoint's state.safetensors; pass "
                 "the checkpoint or run folder", ckpt);
        return -1;
    }
    if (dir[0]) snprintf(path, sizeof path, "%s/model.safetensors", dir);
    else snprintf(path, sizeof path, "%s", ckpt);
    StFile f, state;
    if (st_open_err(&f, path, err, n) != 0) return -1;
    if (ema) {
        snprintf(state_path, sizeof state_path, "%s/state.safetensors", dir);
        if (st_open_err(&state, state_path, err, n) != 0) {
            st_close(&f);
            return -1;
        }
    }
    StWriteTensor *w = cg_calloc((size_t)(f.n ? f.n : 1), sizeof(StWriteTensor));
    int k = 0, drop = 0, rc = -1;
    size_t plen = strlen(ADAPTOR_PREFIX);
    char ema_name[600];
    for (int i = 0; i < f.n; i++) {
        const StTensor *t = &f.tensors[i];
        if (strncmp(t->name, ADAPTOR_PREFIX, plen) == 0) {
            drop++;
            continue;
        }
        if (ema) {   // the same tensor's EMA, fp32
            snprintf(ema_name, sizeof ema_name, "ema.%s", t->name);
            const StTensor *e = st_find(&state, ema_name);
            if (!e) {
                snprintf(err, n, "%s has no %s: the run kept no EMA of its weights (train with "
                         "ema_decay > 0)", state_path, ema_name);
                goto done;
            }
            t = e;
        }
        w[k].name = f.tensors[i].name;
        w[k].dtype = t->dtype;
        w[k].ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++) w[k].shape[d] = t->shape[d];
        w[k].data = st_data(ema ? &state : &f, t);
        k++;
    }
    const char *step = st_meta(&f, "step");
    StMeta meta[] = {{"format", "pt"}, {"producer", ema ? "cgspn export --ema" : "cgspn export"},
                     {"step", step ? step : ""}};
    rc = st_write_err(out, w, k, meta, step ? 3 : 2, NULL, NULL, err, n);
done:
    free(w);
    if (ema) st_close(&state);
    st_close(&f);
    if (kept) *kept = k;
    if (dropped) *dropped = drop;
    return rc;
}

int cmd_export(int argc, char **argv) {
    if (cli_wants_help(argc, argv, 2)) {
        export_usage(stdout);
        return 0;
    }
    const char *out = cli_take_flag(&argc, argv, 2, "--out");
    bool ema = cli_take_switch(&argc, argv, 2, "--ema");
    if (argc != 3 || !out) {
        export_usage(stderr);
        CG_FAIL("see the usage above", "cgspn export needs a checkpoint and --out");
    }
    char err[4096];
    int kept, dropped;
    if (export_student_err(argv[2], out, ema, &kept, &dropped, err, sizeof err) != 0)
        CG_FAIL("", "%s", err);
    printf("wrote %s: %d tensors of the student%s; dropped %d adaptor tensors and the optimizer "
           "state\n", out, kept, ema ? " (their EMA)" : "", dropped);
    return 0;
}
