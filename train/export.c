#include "export.h"
#include "checkpoint.h"
#include "cli_args.h"
#include "distill.h"
#include "../kernels/error.h"
#include "../nn/safetensors.h"
#include <sys/stat.h>

static void export_usage(FILE *f) {
    fprintf(f, "usage: cgspn export CKPT --out student.safetensors\n"
               "Writes the student of CKPT (a checkpoint folder, a run folder: its newest complete\n"
               "checkpoint, or a safetensors file) without the distillation adaptors (adaptors.*)\n"
               "and without optimizer state: timm names, PyTorch layouts, the checkpoint's dtypes;\n"
               "loads with safetensors.torch.load_file. The model keys are in CKPT's config.cfg.\n");
}

int export_student_err(const char *ckpt, const char *out, int *kept, int *dropped, char *err,
                       size_t n) {
    char path[1200];
    struct stat sb;
    if (stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char dir[1024];
        if (ckpt_resolve_err(ckpt, "", dir, sizeof dir, err, n) < 0) return -1;
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
    } else {
        snprintf(path, sizeof path, "%s", ckpt);
    }
    StFile f;
    if (st_open_err(&f, path, err, n) != 0) return -1;
    StWriteTensor *w = cg_calloc((size_t)(f.n ? f.n : 1), sizeof(StWriteTensor));
    int k = 0, drop = 0;
    size_t plen = strlen(ADAPTOR_PREFIX);
    for (int i = 0; i < f.n; i++) {
        const StTensor *t = &f.tensors[i];
        if (strncmp(t->name, ADAPTOR_PREFIX, plen) == 0) {
            drop++;
            continue;
        }
        w[k].name = t->name;
        w[k].dtype = t->dtype;
        w[k].ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++) w[k].shape[d] = t->shape[d];
        w[k].data = st_data(&f, t);
        k++;
    }
    const char *step = st_meta(&f, "step");
    StMeta meta[] = {{"format", "pt"}, {"producer", "cgspn export"}, {"step", step ? step : ""}};
    int rc = st_write_err(out, w, k, meta, step ? 3 : 2, NULL, NULL, err, n);
    free(w);
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
    if (argc != 3 || !out) {
        export_usage(stderr);
        CG_FAIL("see the usage above", "cgspn export needs a checkpoint and --out");
    }
    char err[4096];
    int kept, dropped;
    if (export_student_err(argv[2], out, &kept, &dropped, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    printf("wrote %s: %d tensors of the student; dropped %d adaptor tensors and the optimizer state\n",
           out, kept, dropped);
    return 0;
}
