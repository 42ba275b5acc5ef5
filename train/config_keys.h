// Every config key, once: X(type, name, default, "help").
// type is int, float (C float), string (char[CONFIG_STR_MAX]) or bool (0, 1, true, false).
// Lists (tap indices, curriculum resolutions) are string keys, parsed where they are used
// (config_parse_int_list). Keys whose value is one of a few words also get a line in
// kChoices (train/config.c), which validates them and lists the words in --help.
// Adding a key is one line here; the Config field, parsing, printing and help follow.
// No include guard: this file is included once per expansion of X.

// model
X(string, model,            "vit",     "encoder architecture")
X(int,    img_size,         28,        "input image side in pixels (square images)")
X(int,    in_chans,         1,         "input channels: 1 for Fashion-MNIST, 3 for RGB")
X(int,    patch,            4,         "patch side in pixels; the token grid is img_size/patch")
X(int,    width,            64,        "embedding width C of every block")
X(int,    depth,            4,         "number of blocks")
X(int,    heads,            4,         "attention heads; must divide width")
X(int,    mlp_hidden,       128,       "hidden width of each block's MLP")
X(string, gelu,             "erf",     "GELU in the MLP, exact or the tanh approximation")
X(float,  ln_eps,           1e-6f,     "LayerNorm epsilon (timm ViT uses 1e-6)")
X(bool,   class_token,      1,         "prepend a learned class token (ViT)")
X(string, global_pool,      "token",   "head input, the class token or the mean of patch tokens")
X(float,  layer_scale_init, 0.0f,      "initial LayerScale gamma; 0 = no LayerScale")
X(int,    num_classes,      10,        "classifier outputs; 0 = no head (feature encoder)")
X(string, teacher_prefix,   "",        "prefix stripped from tensor names of loaded weights (OpenCLIP: visual.trunk.)")
X(bool,   pos_embed,        1,         "learned absolute position embedding (ViT)")
X(bool,   qkv_bias,         1,         "bias in the attention qkv projection")
X(int,    gspn_latent,      16,        "C-GSPN latent channels Cc (width / compression)")
X(bool,   gspn_shared_w,    0,         "C-GSPN: 3 propagation weights per position shared by all Cc channels")
X(bool,   gspn_out_norm,    1,         "C-GSPN: LayerNorm over Cc after the 4-way merge")
X(int,    attn_every,       0,         "hybrid: every k-th block (1-based) is an attention block")

// data
X(string, dataset,          "fashion-mnist",                     "dataset name")
X(string, data_dir,         "/usr/share/datasets/fashion-mnist", "folder holding the dataset files")
X(int,    batch_size,       128,       "images per optimizer step (global, all ranks)")

// data loader over shards (`cgspn data build`; data/README.md). Augmentation names follow timm.
X(string, data_shards,      "",        "shard folder from `cgspn data build` (empty: read data_dir's IDX files)")
X(string, train_split,      "train",   "shard split to train on (data_shards/SPLIT.manifest)")
X(string, val_split,        "val",     "shard split to evaluate on")
X(int,    loader_threads,   0,         "loader threads decoding and augmenting images; 0 = all cores")
X(int,    loader_prefetch,  2,         "batches the loader prepares ahead of the one in use")
X(float,  rrc_scale_min,    0.08f,     "random-resized-crop: smallest crop area, as a fraction of the image")
X(float,  rrc_scale_max,    1.0f,      "random-resized-crop: largest crop area fraction")
X(float,  rrc_ratio_min,    0.75f,     "random-resized-crop: smallest aspect ratio (width / height)")
X(float,  rrc_ratio_max,    1.3333334f, "random-resized-crop: largest aspect ratio")
X(float,  hflip,            0.5f,      "probability of a horizontal flip")
X(int,    randaug_n,        0,         "RandAugment ops per image (timm rand-n); 0 = off")
X(float,  randaug_m,        9.0f,      "RandAugment magnitude on timm's 0..10 scale (timm rand-m); draws are clipped to 10")
X(float,  randaug_mstd,     0.5f,      "RandAugment magnitude noise std (timm mstd)")
X(bool,   randaug_inc,      1,         "RandAugment uses timm's increasing op variants (inc1)")
X(float,  reprob,           0.0f,      "random erasing probability per image (timm reprob)")
X(float,  mixup_alpha,      0.0f,      "mixup Beta(alpha, alpha); 0 = off")
X(float,  cutmix_alpha,     0.0f,      "cutmix Beta(alpha, alpha); 0 = off")
X(float,  mixup_prob,       1.0f,      "probability that a batch is mixed when mixup or cutmix is on")
X(float,  mixup_switch_prob, 0.5f,     "with mixup and cutmix both on: probability of cutmix")
X(float,  eval_crop_pct,    0.875f,    "eval: resize the shorter side to img_size / eval_crop_pct, then centre-crop")
X(string, interpolation,    "bilinear", "resampling of crops and resizes (antialiased)")
X(string, data_mean,        "",        "normalization mean per channel, e.g. 0.485,0.456,0.406; empty = the shards' measured mean")
X(string, data_std,         "",        "normalization std per channel; empty = the shards' measured std")

// schedule and optimizer (AdamW, warmup + cosine)
X(int,    epochs,           3,         "passes over the training set (used when max_steps = 0)")
X(int,    max_steps,        0,         "optimizer steps to run; 0 = from epochs")
X(float,  lr,               1e-3f,     "peak learning rate, reached after warmup")
X(float,  min_lr,           1e-5f,     "learning rate at the end of the cosine decay")
X(int,    warmup_steps,     100,       "linear warmup steps from 0 to lr")
X(float,  weight_decay,     0.05f,     "AdamW decoupled weight decay (not on biases, norms, 1-D params)")
X(float,  beta1,            0.9f,      "AdamW first-moment decay")
X(float,  beta2,            0.999f,    "AdamW second-moment decay")
X(float,  adam_eps,         1e-8f,     "AdamW epsilon")
X(float,  grad_clip,        1.0f,      "clip the global gradient norm to this; 0 = no clipping")
X(float,  label_smoothing,  0.0f,      "cross-entropy label smoothing")
X(int,    seed,             1,         "seed for initialization, data order and augmentation")

// run
X(int,    eval_every,       0,         "evaluate every N steps; 0 = at the end of each epoch")
X(int,    log_every,        50,        "print a log line every N steps")
X(int,    threads,          0,         "CPU threads (OpenMP); 0 = all cores")
X(string, run_name,         "",        "run folder name under out_dir; empty = generated from time")
X(string, out_dir,          "checkpoints", "folder for run folders (checkpoints, logs)")
X(int,    ckpt_every,       0,         "write a checkpoint every N steps, and always at the end; 0 = only at the end")
X(int,    keep_last,        3,         "complete checkpoints kept in the run folder, the newest; 0 = all")
X(string, resume,           "",        "continue a run: empty = no; auto = the newest complete checkpoint of this run folder (none yet: start at step 0); or a checkpoint or run folder path")
X(string, precision,        "auto",    "parameters/activations: bf16 (fp32 master weights, moments, reductions) or fp32; auto = bf16 on GPU, fp32 on CPU")
X(string, device,           "auto",    "where to run; auto picks cuda when a GPU is present")

// data parallelism across processes (dist/README.md): mpirun, srun or RANK/WORLD_SIZE launches
X(bool,   zero,             0,         "ZeRO-1: shard AdamW moments and fp32 master weights across ranks (reduce-scatter, local step, all-gather)")
X(float,  bucket_mb,        25.0f,     "gradient all-reduce bucket size in MB; 0 = one bucket")
X(float,  dist_timeout_s,   45.0f,     "a rank waiting this long for another stops the job, naming the late rank")
X(string, dist_rendezvous,  "",        "folder where ranks started without MPI meet (shared across nodes); empty = $CGSPN_RENDEZVOUS")
