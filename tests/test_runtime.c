/*
 * test_runtime.c — the BLAS runs the kernels the CPU can run (runtime.h): with
 * OPENBLAS_CORETYPE unset the tool runs the CPU's strongest core (or the BLAS's own
 * choice when that is as strong); a user's setting always wins; the receipt names
 * the BLAS, its core, who chose it and its measured sgemm rate.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "longstraw/runtime.h"
#include "testutil.h"

int test_runtime_blas_core(void);

static const char *unset_env =
    "env -u OPENBLAS_CORETYPE -u LONGSTRAW_SET_OPENBLAS_CORETYPE -u LONGSTRAW_BLAS_OWN_CORETYPE";

/* `grad` on a tiny model under `env`, its receipt's "blas" object (caller frees *root) */
static int grad_blas(const char *dir, const char *env, cJSON **root, const cJSON **blas) {
    char cmd[4096], rp[900];
    int rc;
    snprintf(rp, sizeof rp, "%s/receipt.json", dir);
    snprintf(cmd, sizeof cmd, "%s %s grad --model %s/m --group %s/g.json --out %s/g.safetensors --receipt %s 2>&1",
             env, LS_CLI_PATH, dir, dir, dir, rp);
    char *out = t_run_capture(cmd, &rc);
    T_CHECK(rc == 0, "grad (%s): rc %d %s", env, rc, out ? out : "");
    free(out);
    char *text = t_read_file(rp, NULL);
    T_CHECK(text, "no receipt");
    *root = cJSON_Parse(text);
    free(text);
    T_CHECK(*root, "receipt is not JSON");
    *blas = cJSON_GetObjectItem(*root, "blas");
    T_CHECK(cJSON_IsObject(*blas), "receipt has no \"blas\" object");
    const cJSON *gf = cJSON_GetObjectItem(*blas, "sgemm_gflops");
    T_CHECK(cJSON_IsNumber(gf) && gf->valuedouble > 0 && isfinite(gf->valuedouble), "sgemm_gflops missing or <= 0");
    return 0;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *e = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(e) ? e->valuestring : "";
}

int test_runtime_blas_core(void) {
    ls_blas_info b;
    ls_blas_info_get(&b);
    char advice[512];
    int adv = ls_blas_advice(advice, sizeof advice);
    T_CHECK(adv == b.weaker && (adv == 0) == (advice[0] == 0), "advice %d (%s) but weaker %d", adv, advice, b.weaker);
    printf("  this process: %s kernels chosen by %s, the CPU runs %s%s%s\n", b.core, b.source,
           b.cpu_core[0] ? b.cpu_core : "(nothing better than SSE)", adv ? "; " : "", advice);
    /* the test binary calls ls_runtime_setup first: unless the user chose, no weaker core */
    if (strcmp(b.source, "user") != 0) T_CHECK(!b.weaker, "%s kernels on a CPU that runs %s", b.core, b.cpu_core);
    if (!b.cpu_core[0]) T_SKIP("this CPU runs nothing better than the BLAS's SSE kernels: no choice to check");

    char dir[512], path[800], cmd[2048];
    T_CHECK(t_make_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(cmd, sizeof cmd, "%s/tests/reference/fixtures/next_moe/config.json", LS_SOURCE_DIR);
    snprintf(path, sizeof path, "%s/m", dir);
    T_CHECK(t_write_model(cmd, path, 4) == 0, "a model from %s", cmd);
    snprintf(path, sizeof path, "%s/g.json", dir);
    FILE *f = fopen(path, "w");
    T_CHECK(f, "group");
    fputs("{\"prompt\": [5, 9, 12, 30, 2, 7, 8, 1], \"responses\": [[3, 4], [9]], \"rewards\": [1, 0]}\n", f);
    fclose(f);

    /* unset: the strongest the CPU runs, by the BLAS or by us */
    cJSON *r;
    const cJSON *bl;
    if (grad_blas(dir, unset_env, &r, &bl)) return 1;
    const cJSON *weak = cJSON_GetObjectItem(bl, "weaker_than_cpu");
    T_CHECK(cJSON_IsFalse(weak), "unset: the tool ran %s kernels (chosen by %s) on a CPU that runs %s", jstr(bl, "core"),
            jstr(bl, "chosen_by"), jstr(bl, "cpu_best_core"));
    T_CHECK(!strcmp(jstr(bl, "chosen_by"), "blas") || !strcmp(jstr(bl, "chosen_by"), "longstraw"), "unset: chosen by %s",
            jstr(bl, "chosen_by"));
    T_CHECK(!strcasecmp(jstr(bl, "cpu_best_core"), b.cpu_core), "cpu_best_core %s, expected %s",
            jstr(bl, "cpu_best_core"), b.cpu_core);
    printf("  unset: %s kernels (chosen by %s), sgemm %.0f GFLOP/s\n", jstr(bl, "core"), jstr(bl, "chosen_by"),
           cJSON_GetObjectItem(bl, "sgemm_gflops")->valuedouble);
    cJSON_Delete(r);

    /* the user's choice wins, even a weak one */
    char env[512];
    snprintf(env, sizeof env, "%s OPENBLAS_CORETYPE=Prescott", unset_env);
    if (grad_blas(dir, env, &r, &bl)) return 1;
    T_CHECK(!strcmp(jstr(bl, "core"), "Prescott") && !strcmp(jstr(bl, "chosen_by"), "user"),
            "OPENBLAS_CORETYPE=Prescott: %s kernels chosen by %s", jstr(bl, "core"), jstr(bl, "chosen_by"));
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(bl, "weaker_than_cpu")), "Prescott not reported weaker than %s", b.cpu_core);
    cJSON_Delete(r);
    T_CHECK(t_remove_dir(dir) == 0, "cleanup");
    return 0;
}
