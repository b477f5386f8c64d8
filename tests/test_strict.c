/*
 * test_strict.c — the device boundary tested on the CPU (issue 33). The strict backend
 * (backend.h) keeps every buffer unreadable to host code outside its ops and refuses a
 * host pointer handed to an op; these tests show that it does both (in a child process,
 * which must die of the fault), that its ops equal the CPU backend's, that an arena's
 * host part follows the arena's marks, and that the tool under `--backend strict` writes
 * what it writes under the CPU backend, bit for bit: logprobs, grad and step of both
 * families in both modes (LoRA, a reference, SFT, the indexer KL), train with a resume,
 * and eval's greedy decoding.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longstraw/backend.h"
#include "longstraw/family.h"
#include "longstraw/files.h"
#include "testutil.h"

int test_backend_strict_boundary(void);
int test_strict_tool_equal(void);
int test_strict_tool_equal_mpi(void);
int test_state_on_host(void);

/* Run fn in a child; the signal that ended it (0: it exited). */
static int child_signal(void (*fn)(void)) {
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static volatile float sink;

static void host_read(void) {
    const ls_backend *be = ls_backend_strict();
    float *p = be->i->buf_alloc(be, 4096, 64);
    if (!p) _exit(3);
    sink = p[1]; /* host code reading device memory: must fault */
    _exit(0);
}

static void host_write(void) {
    const ls_backend *be = ls_backend_strict();
    float *p = be->i->buf_alloc(be, (size_t)8 << 20, 64); /* a huge-page sized buffer */
    if (!p) _exit(3);
    p[(2 << 20) + 5] = 1.0f;
    _exit(0);
}

static void host_pointer_to_op(void) {
    const ls_backend *be = ls_backend_strict();
    float *y = be->i->buf_alloc(be, 64 * sizeof(float), 64);
    float x[64] = {0};
    if (!y) _exit(3);
    ls_op_add_to(be, y, x, 64); /* x is host memory: the op refuses it (abort) */
    _exit(0);
}

int test_backend_strict_boundary(void) {
    int sig = child_signal(host_read);
    T_CHECK(sig == SIGSEGV, "a host read of a strict buffer ended with signal %d, not SIGSEGV", sig);
    sig = child_signal(host_write);
    T_CHECK(sig == SIGSEGV, "a host write into a strict buffer ended with signal %d, not SIGSEGV", sig);
    sig = child_signal(host_pointer_to_op);
    T_CHECK(sig == SIGABRT, "an op given a host pointer ended with signal %d, not SIGABRT", sig);

    /* ops and copies through the strict backend equal the CPU's, bit for bit */
    const ls_backend *S = ls_backend_strict(), *C = ls_backend_cpu();
    enum { M = 7, K = 13, N = 5 };
    float a[M * K], b[K * N], c_cpu[M * N], c_str[M * N], r_cpu[M], r_str[M];
    ls_rng rng;
    ls_rng_seed(&rng, 7);
    t_fill_normal(a, M * K, &rng, 1.0f);
    t_fill_normal(b, K * N, &rng, 1.0f);
    float *da = S->i->buf_alloc(S, sizeof a, 64), *db = S->i->buf_alloc(S, sizeof b, 64);
    float *dc = S->i->buf_alloc(S, sizeof c_str, 64), *dr = S->i->buf_alloc(S, sizeof r_str, 64);
    T_CHECK(da && db && dc && dr, "strict buffers");
    S->i->to_device(S, da, a, sizeof a);
    S->i->to_device(S, db, b, sizeof b);
    ls_op_gemm(C, 0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c_cpu, N);
    ls_op_gemm(S, 0, 0, M, N, K, 1.0f, da, K, db, N, 0.0f, dc, N);
    ls_op_rmsnorm_fwd(C, c_cpu, r_cpu, c_cpu, b, M, N, 1e-6f);
    ls_op_rmsnorm_fwd(S, dc, dr, dc, db, M, N, 1e-6f);
    S->i->to_host(S, c_str, dc, sizeof c_str);
    S->i->to_host(S, r_str, dr, sizeof r_str);
    T_CHECK(!memcmp(c_cpu, c_str, sizeof c_cpu) && !memcmp(r_cpu, r_str, sizeof r_cpu),
            "gemm + rmsnorm through the strict backend differ from the CPU's");
    T_CHECK(ls_backend_strict_owns(dc + 3) && !ls_backend_strict_owns(c_str), "ownership of buffers");
    S->i->buf_free(S, da, sizeof a), S->i->buf_free(S, db, sizeof b);
    S->i->buf_free(S, dc, sizeof c_str), S->i->buf_free(S, dr, sizeof r_str);

    /* an arena on the strict backend: device blocks, host bookkeeping in its host part,
     * both released by one mark */
    ls_arena ar;
    ls_arena_init(&ar, "t", 1 << 20);
    ls_arena_set_backend(&ar, S);
    T_CHECK(!ls_arena_host_readable(&ar), "a strict arena says it is host memory");
    float *d0 = ls_arena_alloc(&ar, 1000);
    ls_arena_mark mk = ls_arena_get_mark(&ar);
    int64_t *h = ls_arena_host_calloc(&ar, 100, sizeof *h);
    float *d1 = ls_arena_alloc(&ar, 5000);
    T_CHECK(d0 && h && d1 && ls_backend_strict_owns(d1) && !ls_backend_strict_owns(h), "device/host parts");
    h[99] = 5; /* host memory: readable */
    T_CHECK(ls_arena_host_cur(&ar) == 832, "host part holds %zu bytes, expected 832 (800 in 64-byte units)", ls_arena_host_cur(&ar));
    ls_arena_release(&ar, mk);
    T_CHECK(ls_arena_host_cur(&ar) == 0 && ar.cur == 1024, "after release: host %zu, device %zu bytes",
            ls_arena_host_cur(&ar), ar.cur);
    ls_arena_free(&ar);

    /* the registry: names, and a refusal that names the choices */
    const ls_backend *be;
    T_OK(ls_backend_open("strict", &be));
    T_CHECK(be == S, "open(strict)");
    T_OK(ls_backend_open(NULL, &be));
    T_CHECK(be == C, "open(NULL) is the CPU");
    T_CHECK(ls_backend_open("tpu", &be) == LS_ERR_ARG && strstr(ls_err_msg(), "cpu|strict|cuda"),
            "unknown backend: %s", ls_err_msg());
    T_CHECK(ls_backend_open("cuda:x", &be) != LS_OK, "cuda:x accepted");
    return 0;
}

/* ---- the tool under --backend strict equals the CPU backend ------------------------------ */

/* 1 when two files hold the same bytes */
static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = t_read_file(a, &na), *y = t_read_file(b, &nb);
    int same = x && y && na == nb && na > 0 && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* 1 when two text files are equal but for the lines holding `skip` (timings) */
static int same_file_but(const char *a, const char *b, const char *skip) {
    char *x = t_read_file(a, NULL), *y = t_read_file(b, NULL);
    int same = x && y && *x;
    char *p = x, *q = y;
    while (same && (p || q)) {
        while (p && *p && strstr(p, skip) && strstr(p, skip) < (strchr(p, '\n') ? strchr(p, '\n') : p + strlen(p)))
            p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
        while (q && *q && strstr(q, skip) && strstr(q, skip) < (strchr(q, '\n') ? strchr(q, '\n') : q + strlen(q)))
            q = strchr(q, '\n') ? strchr(q, '\n') + 1 : NULL;
        if (!p || !*p || !q || !*q) {
            same = (!p || !*p) && (!q || !*q);
            break;
        }
        size_t lp = strcspn(p, "\n"), lq = strcspn(q, "\n");
        same = lp == lq && !memcmp(p, q, lp);
        p = p[lp] ? p + lp + 1 : NULL;
        q = q[lq] ? q + lq + 1 : NULL;
    }
    free(x);
    free(y);
    return same;
}

/* What starts the tool: nothing (one rank) or mpirun with its options and -np N. */
static char launch[512] = "";

/* `longstraw ARGS --backend B` (B may carry more flags) with its stdout into
 * dir/<tag>.<label>.out; 0 on exit 0 */
static int run_as(const char *dir, const char *tag, const char *label, const char *backend, const char *args) {
    int rc;
    char *out = t_run_fmt(&rc, "%s%s %s --backend %s > %s/%s.%s.out", launch, LS_CLI_PATH, args, backend, dir, tag,
                          label);
    if (rc != 0) fprintf(stderr, "  %s (%s) exit %d: %s\n", tag, backend, rc, out ? out : "");
    free(out);
    return rc;
}

static int run_tool(const char *dir, const char *tag, const char *backend, const char *args) {
    return run_as(dir, tag, backend, backend, args);
}

/* The second run's placement: the strict backend's (the default), or with the prompt
 * state in host memory staged per layer (test_state_on_host). */
static const char *second_label = "strict", *second_backend = "strict";

/* The command with OUT replaced by dir/<tag>.<backend> (a file or a directory) under both
 * backends; the files named in `files` (relative to that path; "" = the path itself, "-"
 * = stdout) compared bit for bit. */
static int same_both(const char *dir, const char *tag, const char *fmt, const char *const *files) {
    char out[2][700], args[2][7000];
    const char *lb[2] = {"cpu", second_label}, *bk[2] = {"cpu", second_backend};
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof out[k], "%s/%s.%s", dir, tag, lb[k]);
        snprintf(args[k], sizeof args[k], fmt, out[k]);
        if (run_as(dir, tag, lb[k], bk[k], args[k]) != 0) return 1;
    }
    for (int i = 0; files[i]; i++) {
        char a[1400], b[1400];
        if (!strcmp(files[i], "-")) {
            snprintf(a, sizeof a, "%s.out", out[0]);
            snprintf(b, sizeof b, "%s.out", out[1]);
        } else {
            snprintf(a, sizeof a, "%s%s%s", out[0], files[i][0] ? "/" : "", files[i]);
            snprintf(b, sizeof b, "%s%s%s", out[1], files[i][0] ? "/" : "", files[i]);
        }
        T_CHECK(same_file(a, b), "%s: %s differs between --backend cpu and %s (or is missing)", tag, files[i],
                second_backend);
    }
    return 0;
}

int test_strict_tool_equal(void) {
    launch[0] = '\0';
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    const char *fx[] = {"next_moe", "q35_moe", "mla_glm"};
    const char *file[] = {"", NULL}, *std[] = {"-", NULL}, *model[] = {"model.safetensors", NULL};
    const char *adapter[] = {"adapter_model.safetensors", NULL};
    char fmt[3000], tag[128];
    int checks = 0;
    for (size_t f = 0; f < sizeof fx / sizeof *fx; f++) {
        char d[700];
        snprintf(d, sizeof d, "%s/tests/reference/fixtures/%s", LS_SOURCE_DIR, fx[f]);
        snprintf(tag, sizeof tag, "%s_logprobs", fx[f]);
        snprintf(fmt, sizeof fmt, "logprobs --model %s --group %s/group_train.json --threads 1", d, d);
        if (same_both(dir, tag, fmt, std)) return 1;
        const char *modes[] = {"prefix-frozen", "full"};
        for (int m = 0; m < 2; m++) {
            snprintf(tag, sizeof tag, "%s_grad_%d", fx[f], m);
            snprintf(fmt, sizeof fmt, "grad --model %s --group %s/group_train.json --mode %s --threads 1 --out %%s", d, d,
                     modes[m]);
            if (same_both(dir, tag, fmt, file)) return 1;
            snprintf(tag, sizeof tag, "%s_step_%d", fx[f], m);
            snprintf(fmt, sizeof fmt,
                     "step --model %s --group %s/group_train.json --mode %s --threads 1 --weight-decay 0.1 "
                     "--max-grad-norm 0.5 --num-iterations 2 --out %%s", d, d, modes[m]);
            if (same_both(dir, tag, fmt, model)) return 1;
            checks += 3;
        }
        snprintf(tag, sizeof tag, "%s_lora", fx[f]);
        snprintf(fmt, sizeof fmt, "step --model %s --group %s/group_train.json --lora-rank 4 --threads 1 --out %%s", d, d);
        if (same_both(dir, tag, fmt, adapter)) return 1;
        snprintf(tag, sizeof tag, "%s_ref", fx[f]);
        snprintf(fmt, sizeof fmt,
                 "grad --model %s --group %s/group_train.json --beta 0.1 --ref-model %s --state-dtype bf16 --threads 1 "
                 "--out %%s", d, d, d);
        if (same_both(dir, tag, fmt, file)) return 1;
        snprintf(tag, sizeof tag, "%s_sft", fx[f]);
        snprintf(fmt, sizeof fmt, "grad --model %s --group %s/group_train.json --loss sft --no-capture --threads 1 "
                                  "--out %%s", d, d);
        if (same_both(dir, tag, fmt, file)) return 1;
        checks += 4;
    }
    { /* the receipt of a step under strict: device bytes and the host parts' apart */
        char path[900];
        snprintf(path, sizeof path, "%s/next_moe_step_0.strict/receipt.json", dir);
        char *r = t_read_file(path, NULL);
        T_CHECK(r, "read %s", path);
        const char *dp = strstr(r, "\"device_peak_bytes\": {\"strict\": "), *hp = dp ? strstr(dp, "\"host\": ") : NULL;
        const char *pp = strstr(r, "\"arena_host_part_peak_bytes\": {\"fixed\": ");
        long long dev = dp ? atoll(dp + strlen("\"device_peak_bytes\": {\"strict\": ")) : 0;
        long long host = hp ? atoll(hp + strlen("\"host\": ")) : 0;
        long long fixed_host = pp ? atoll(pp + strlen("\"arena_host_part_peak_bytes\": {\"fixed\": ")) : 0;
        T_CHECK(dev > 0 && host > 0 && fixed_host > 0,
                "receipt under strict: device %lld, host %lld, fixed arena's host part %lld bytes (all expected > 0)",
                dev, host, fixed_host);
        free(r);
    }
    {
        char d[700];
        snprintf(d, sizeof d, "%s/tests/reference/fixtures/mla_glm_ic", LS_SOURCE_DIR);
        snprintf(fmt, sizeof fmt, "grad --model %s --group %s/group_train.json --indexer-kl-coef 1 "
                                  "--threads 1 --out %%s", d, d);
        if (same_both(dir, "indexer_kl", fmt, file)) return 1;
        checks++;
    }
    /* train (SFT on the passkey task: the gradients are not zero) and a resume, on a tiny
     * model of the byte-level vocabulary made by the family's write_random; eval's greedy
     * decoding of both families */
    char cfg[700], m[700], cfg2[700], m2[700];
    snprintf(cfg, sizeof cfg, "%s/c.json", dir);
    snprintf(m, sizeof m, "%s/m", dir);
    static const char tiny[] =
        "{\"model_type\": \"qwen3_next\", \"vocab_size\": 260, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"linear_num_key_heads\": 2,"
        " \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8,"
        " \"intermediate_size\": 48, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16,"
        " \"full_attention_interval\": 2}";
    T_OK(ls_write_file_atomic(cfg, tiny, strlen(tiny)));
    T_CHECK(t_write_model(cfg, m, 3) == 0, "model from %s", cfg);
    /* the MLA family's tiny model: the fixture's config with the byte-level vocabulary */
    snprintf(cfg2, sizeof cfg2, "%s/c2.json", dir);
    snprintf(m2, sizeof m2, "%s/m2", dir);
    {
        char src[700], *text;
        snprintf(src, sizeof src, "%s/tests/reference/fixtures/mla_glm/config.json", LS_SOURCE_DIR);
        text = t_read_file(src, NULL);
        T_CHECK(text, "read %s", src);
        char *v = strstr(text, "\"vocab_size\": 97");
        T_CHECK(v, "vocab_size in %s", src);
        memcpy(v, "\"vocab_size\":260", 16);
        ls_status ws = ls_write_file_atomic(cfg2, text, strlen(text));
        free(text);
        T_OK(ws);
    }
    T_CHECK(t_write_model(cfg2, m2, 4) == 0, "model from %s", cfg2);
    const char *ck[] = {"checkpoint-2/model.safetensors", "checkpoint-2/optimizer.safetensors",
                        "checkpoint-3/model.safetensors", "checkpoint-3/optimizer.safetensors", NULL};
    const char *mm[2] = {m, m2};
    for (int k = 0; k < 2; k++) {
        snprintf(tag, sizeof tag, "train_%d", k);
        for (int b = 0; b < 2; b++) {
            const char *bk = b ? "strict" : "cpu";
            char run[700];
            snprintf(run, sizeof run, "%s/%s.%s", dir, tag, bk);
            snprintf(fmt, sizeof fmt,
                     "train --model %s --out %s --loss sft --task passkey --prompt-len 300 --updates 2 --lr 1e-2 "
                     "--threads 1 --quiet --backend %s > /dev/null && %s train --resume %s --updates 3 --quiet",
                     mm[k], run, bk, LS_CLI_PATH, run);
            if (run_tool(dir, tag, bk, fmt)) return 1;
        }
        for (int i = 0; ck[i]; i++) {
            char a[1400], b[1400];
            snprintf(a, sizeof a, "%s/%s.cpu/%s", dir, tag, ck[i]);
            snprintf(b, sizeof b, "%s/%s.strict/%s", dir, tag, ck[i]);
            T_CHECK(same_file(a, b), "%s: %s differs between --backend cpu and strict", tag, ck[i]);
        }
        /* eval: the JSON document but its timing lines */
        snprintf(tag, sizeof tag, "eval_%d", k);
        for (int b = 0; b < 2; b++) {
            const char *bk = b ? "strict" : "cpu";
            snprintf(fmt, sizeof fmt, "eval --model %s --prompt-len 300,340 --num-prompts 2 --max-new-tokens 5 "
                                      "--threads 1 --quiet", mm[k]);
            if (run_tool(dir, tag, bk, fmt)) return 1;
        }
        char a[1400], b[1400];
        snprintf(a, sizeof a, "%s/%s.cpu.out", dir, tag);
        snprintf(b, sizeof b, "%s/%s.strict.out", dir, tag);
        T_CHECK(same_file_but(a, b, "seconds"), "%s: eval's JSON differs between --backend cpu and strict", tag);
        checks += 2;
    }
    printf("  %d commands equal under --backend cpu and strict, bit for bit\n", checks);
    t_remove_dir(dir);
    return 0;
}

/* The same under mpirun: context parallelism (2 and 3 ranks, both layouts, both modes,
 * bf16 pages) and expert parallelism move the backend's memory through host staging
 * (src/dist/stage.h); the strict backend faults on any slip. Under a sanitizer only 3
 * ranks (as test_cp.c: OpenMPI's start-up is slow there). */
int test_strict_tool_equal_mpi(void) {
    if (!LS_MPIEXEC[0]) T_SKIP("built without MPI");
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    const char *file[] = {"", NULL}, *model[] = {"model.safetensors", NULL}, *adapter[] = {"adapter_model.safetensors", NULL};
    const char *std[] = {"-", NULL};
    char fmt[6000], tag[160], d[3][700];
    const char *fx[3] = {"next_moe", "q35_moe", "mla_glm"};
    for (int f = 0; f < 3; f++) snprintf(d[f], sizeof d[f], "%s/tests/reference/fixtures/%s", LS_SOURCE_DIR, fx[f]);
    int checks = 0;
    for (int np = 2; np <= 3; np++) {
#ifdef LS_TEST_SANITIZED
        if (np == 2) continue;
#endif
        snprintf(launch, sizeof launch, LS_MPI_ENV "%s --oversubscribe --allow-run-as-root -np %d ", LS_MPIEXEC, np);
        for (int f = 0; f < 3; f++) {
            snprintf(tag, sizeof tag, "%s_lp_np%d", fx[f], np);
            snprintf(fmt, sizeof fmt, "logprobs --model %s --group %s/group_train.json --threads 1", d[f], d[f]);
            if (same_both(dir, tag, fmt, std)) return 1;
            for (int m = 0; m < 2; m++) {
                snprintf(tag, sizeof tag, "%s_grad_np%d_%d", fx[f], np, m);
                snprintf(fmt, sizeof fmt, "grad --model %s --group %s/group_train.json --mode %s --threads 1%s --out %%s",
                         d[f], d[f], m ? "full" : "prefix-frozen",
                         np == 3 ? " --cp-layout zigzag --state-dtype bf16" : "");
                if (same_both(dir, tag, fmt, file)) return 1;
                checks++;
            }
            checks++;
        }
        snprintf(tag, sizeof tag, "step_np%d", np);
        snprintf(fmt, sizeof fmt, "step --model %s --group %s/group_train.json --mode full --threads 1 --out %%s", d[0],
                 d[0]);
        if (same_both(dir, tag, fmt, model)) return 1;
        snprintf(tag, sizeof tag, "lora_np%d", np);
        snprintf(fmt, sizeof fmt, "step --model %s --group %s/group_train.json --lora-rank 4 --threads 1 --out %%s", d[2],
                 d[2]);
        if (same_both(dir, tag, fmt, adapter)) return 1;
        snprintf(tag, sizeof tag, "ikl_np%d", np);
        snprintf(fmt, sizeof fmt, "grad --model %s/tests/reference/fixtures/mla_glm_ic --group "
                                  "%s/tests/reference/fixtures/mla_glm_ic/group_train.json --indexer-kl-coef 1 "
                                  "--threads 1 --out %%s", LS_SOURCE_DIR, LS_SOURCE_DIR);
        if (same_both(dir, tag, fmt, file)) return 1;
        checks += 3;
        if (np == 2) { /* expert parallelism: the experts over both ranks */
            snprintf(fmt, sizeof fmt, "step --model %s --group %s/group_train.json --ep 2 --threads 1 --out %%s", d[2],
                     d[2]);
            if (same_both(dir, "ep2", fmt, model)) return 1;
            checks++;
        }
    }
    launch[0] = '\0';
    printf("  %d commands under mpirun equal under --backend cpu and strict, bit for bit\n", checks);
    t_remove_dir(dir);
    return 0;
}

/* The receipt's prompt-state bytes (issue 33): on the host, staged to the device one layer
 * at a time; measured equals predicted within one page per table of the widest layer on
 * the device (a rank may hold a page fewer than the fullest), and on the host within one
 * page per table of every layer. */
static int receipt_placement_ok(const char *path, int64_t slack_dev, int64_t slack_host) {
    char *r = t_read_file(path, NULL);
    T_CHECK(r, "read %s", path);
    cJSON *j = cJSON_Parse(r);
    free(r);
    T_CHECK(j, "%s: not JSON", path);
    cJSON *b = cJSON_GetObjectItem(j, "prompt_state_bytes"), *mem = b ? cJSON_GetObjectItem(b, "memory") : NULL;
    cJSON *pr = b ? cJSON_GetObjectItem(b, "predicted") : NULL, *me = b ? cJSON_GetObjectItem(b, "measured") : NULL;
    int ok = mem && cJSON_IsString(mem) && pr && me;
    double v[4] = {0, 0, 0, 0};
    const char *k[4] = {"device", "host", "device", "host"};
    for (int i = 0; ok && i < 4; i++) {
        cJSON *x = cJSON_GetObjectItem(i < 2 ? pr : me, k[i]);
        ok = x && cJSON_IsNumber(x);
        if (ok) v[i] = x->valuedouble;
    }
    int staged = ok && !strcmp(mem->valuestring, "host, staged");
    cJSON_Delete(j);
    T_CHECK(ok, "%s: no prompt_state_bytes {memory, predicted {device, host}, measured {device, host}}", path);
    T_CHECK(staged, "%s: the prompt state is not reported as host memory staged to the device", path);
    T_CHECK(v[0] > 0 && v[1] > 0, "%s: predicted device %.0f, host %.0f bytes (both expected > 0)", path, v[0], v[1]);
    T_CHECK(!(fabs(v[2] - v[0]) > (double)slack_dev) && !(fabs(v[3] - v[1]) > (double)slack_host),
            "%s: measured device %.0f / host %.0f bytes, predicted %.0f / %.0f (slack %lld / %lld)", path, v[2], v[3],
            v[0], v[1], (long long)slack_dev, (long long)slack_host);
    return 0;
}

/* `plan --state-on host --json` for the step whose receipt is at `receipt` (the fixture's
 * prompt, f32 pages of 64, sweep chunks of 7 in full mode): the same device and host bytes
 * as the receipt's prediction. */
static int plan_matches_receipt(const char *fixture, int full, const char *receipt) {
    char gpath[2200];
    snprintf(gpath, sizeof gpath, "%s/group_train.json", fixture);
    char *gt = t_read_file(gpath, NULL), *rt = t_read_file(receipt, NULL);
    cJSON *g = gt ? cJSON_Parse(gt) : NULL, *r = rt ? cJSON_Parse(rt) : NULL;
    free(gt), free(rt);
    cJSON *pr = g ? cJSON_GetObjectItem(g, "prompt") : NULL;
    int P = pr ? cJSON_GetArraySize(pr) : 0, rc;
    cJSON_Delete(g);
    char *out = t_run_fmt(&rc, "%s plan --model %s --prompt %d --state-dtype f32 --mode %s --sweep-chunk 7 "
                               "--state-on host --json", LS_CLI_PATH, fixture, P, full ? "full" : "prefix-frozen");
    cJSON *pl = out && rc == 0 ? cJSON_Parse(out) : NULL;
    free(out);
    cJSON *b = r ? cJSON_GetObjectItem(r, "prompt_state_bytes") : NULL, *want = b ? cJSON_GetObjectItem(b, "predicted") : NULL;
    cJSON *pd = pl ? cJSON_GetObjectItem(pl, "state_device_bytes_per_rank") : NULL;
    cJSON *ph = pl ? cJSON_GetObjectItem(pl, "state_host_bytes_per_rank") : NULL;
    cJSON *rd = want ? cJSON_GetObjectItem(want, "device") : NULL, *rh = want ? cJSON_GetObjectItem(want, "host") : NULL;
    int ok = P > 0 && pd && ph && rd && rh && pd->valuedouble == rd->valuedouble && ph->valuedouble == rh->valuedouble;
    double v[4] = {pd ? pd->valuedouble : -1, ph ? ph->valuedouble : -1, rd ? rd->valuedouble : -1, rh ? rh->valuedouble : -1};
    cJSON_Delete(pl), cJSON_Delete(r);
    T_CHECK(ok, "plan --state-on host of %s (P %d): device %.0f / host %.0f bytes; the receipt %s predicted %.0f / %.0f",
            fixture, P, v[0], v[1], receipt, v[2], v[3]);
    return 0;
}

/* `--state-on host` (issue 33): the prompt state in host memory, one layer at a time
 * staged to the strict backend's memory, writes what the CPU backend with the state in
 * place writes, bit for bit — logprobs, grad and step of both families in both modes,
 * at one rank and under mpirun (2, 3 and, unsanitized, 4 ranks; page size 3, which the
 * fixtures' prompts and the rank counts do not divide; zigzag and bf16 pages at 3) —
 * and its receipt's device and host bytes equal the plan's. The strict backend faults
 * on any page an op reads that was not staged, and the stage holds one layer: the other
 * layers' tables are empty while a layer runs. */
int test_state_on_host(void) {
    char dir[512];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    second_label = "host", second_backend = "strict --state-on host";
    const char *fx[] = {"next_moe", "q35_moe", "mla_glm"};
    const char *file[] = {"", NULL}, *std[] = {"-", NULL}, *model[] = {"model.safetensors", NULL};
    char fmt[6000], tag[160], d[3][700], path[1400];
    for (int f = 0; f < 3; f++) snprintf(d[f], sizeof d[f], "%s/tests/reference/fixtures/%s", LS_SOURCE_DIR, fx[f]);
    int checks = 0, rc = 1;
    for (int np = 1; np <= 4; np++) {
        if (np > 1 && !LS_MPIEXEC[0]) break; /* (one rank only without MPI) */
#ifdef LS_TEST_SANITIZED
        if (np == 2 || np == 4) continue;
#endif
        if (np == 1) launch[0] = '\0';
        else snprintf(launch, sizeof launch, LS_MPI_ENV "%s --oversubscribe --allow-run-as-root -np %d ", LS_MPIEXEC, np);
        const char *extra = np == 1 ? "" : np == 3 ? " --page-size 3 --cp-layout zigzag --state-dtype bf16" : " --page-size 3";
        for (int f = 0; f < 3; f++) {
            if (np > 1 && f == 1) continue; /* under CP: one model of each family */
            snprintf(tag, sizeof tag, "%s_lp_np%d", fx[f], np);
            snprintf(fmt, sizeof fmt, "logprobs --model %s --group %s/group_train.json --threads 1%s", d[f], d[f], extra);
            if (same_both(dir, tag, fmt, std)) goto out;
            for (int m = 0; m < 2; m++) {
                snprintf(tag, sizeof tag, "%s_grad_np%d_%d", fx[f], np, m);
                snprintf(fmt, sizeof fmt, "grad --model %s --group %s/group_train.json --mode %s --threads 1%s --out %%s",
                         d[f], d[f], m ? "full" : "prefix-frozen", extra);
                if (same_both(dir, tag, fmt, file)) goto out;
                snprintf(tag, sizeof tag, "%s_step_np%d_%d", fx[f], np, m);
                snprintf(fmt, sizeof fmt, "step --model %s --group %s/group_train.json --mode %s --capture-chunk 5 "
                                          "--sweep-chunk 7 --threads 1%s --out %%s", d[f], d[f], m ? "full" : "prefix-frozen",
                         extra);
                if (same_both(dir, tag, fmt, model)) goto out;
                /* one page per table: a K and a V page of the widest layer; on the host, of every layer */
                int64_t page = (np == 1 ? 64 : 3) * 64 * 4, layers = 8;
                snprintf(path, sizeof path, "%s/%s.host/receipt.json", dir, tag);
                if (receipt_placement_ok(path, np == 1 ? 0 : 2 * page, np == 1 ? 0 : 2 * page * layers)) goto out;
                if (np == 1 && plan_matches_receipt(d[f], m, path)) goto out;
                checks += 2;
            }
            checks++;
        }
    }
    launch[0] = '\0';
    { /* what is not built is refused, naming the flag: train's rollouts decode from forks */
        int trc;
        char *o = t_run_fmt(&trc, "%s train --model %s --out %s/t --task passkey --loss sft --state-on host 2>&1", LS_CLI_PATH, d[0],
                            dir);
        int said = o && strstr(o, "--state-on host");
        free(o);
        T_CHECK(trc == 2 && said, "train --state-on host: exit %d (expected 2, the flag named)", trc);
        o = t_run_fmt(&trc, "%s grad --model %s --group %s/group_train.json --out %s/x --state-on disk 2>&1", LS_CLI_PATH,
                      d[0], d[0], dir);
        said = o && strstr(o, "disk");
        free(o);
        T_CHECK(trc == 2 && said, "--state-on disk: exit %d (expected 2, the value named)", trc);
    }
    printf("  %d commands with the prompt state on the host equal the CPU's bit for bit; receipts as planned\n", checks);
    rc = 0;
    t_remove_dir(dir);
out:
    second_label = "strict", second_backend = "strict";
    launch[0] = '\0';
    return rc;
}
