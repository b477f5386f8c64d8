/*
 * receipt.c — what a training command knows about itself before and after an update:
 * its trainable set (policy, gradients, reference, AdamW), the memory check against
 * the plan before anything sized by the prompt is allocated, and the receipt after.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longstraw/backend.h"
#include "longstraw/runtime.h"
#include "longstraw/trainer.h"

ls_status ls_trainable_open(ls_trainable *p, const ls_policy_spec *spec, int with_adam, ls_arenas *ar) {
    memset(p, 0, sizeof *p);
    p->spec = *spec;
    LS_TRY(ls_policy_open(&p->p, &p->spec, ar));
    p->cfg = ls_model_config(&p->p.policy);
    return with_adam ? ls_adamw_init(&p->adam, &p->p, &ar->a[LS_ARENA_FIXED]) : LS_OK;
}

void ls_trainable_close(ls_trainable *p) { ls_policy_close(&p->p); }

/* Whether prompt + fixed + grad bytes per rank fit this machine's memory (90%) times the
 * ranks sharing it; else the refusal, naming what a prompt of P tokens (`what`) needs. */
static ls_status fits(const char *what, int64_t P, const ls_state_plan_t *plan, double prompt, size_t fixed,
                      size_t grad, int N, const char *advice) {
    double need = prompt + (double)grad + (double)fixed;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || psz <= 0) return LS_OK; /* unknown: nothing to compare with */
    const char *lsz = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int local = lsz && atoi(lsz) > 0 ? atoi(lsz) : N; /* ranks sharing this machine */
    double have = (double)pages * (double)psz, gib = 1024.0 * 1024.0 * 1024.0;
    if (need * local <= 0.9 * have) return LS_OK;
    return ls_err(LS_ERR_ARG,
                  "%s of %lld tokens will not fit: per rank the plan holds %.2f GiB of prompt state (%lld pages "
                  "per attention layer%s, %d attention + %d Gated DeltaNet layers) + %.2f GiB fixed + %.2f GiB "
                  "gradients = %.2f GiB, x %d rank%s on this machine = %.2f GiB, but it has %.2f GiB of memory; %s",
                  what, (long long)P, prompt / gib, (long long)plan->pages_per_rank, N > 1 ? " on this rank" : "",
                  plan->n_attn, plan->n_gdn, (double)fixed / gib, (double)grad / gib, need / gib, local,
                  local == 1 ? "" : "s", need * local / gib, have / gib, advice);
}

ls_status ls_check_fits(const ls_trainable *pol, const ls_grpo_opts *o, int64_t P, int optimizer) {
    if (P < 1) return LS_OK;
    const ls_comm *cp = o->fwd.comm;
    int N = cp ? ls_comm_size(cp) : 1;
    ls_state_plan_t plan;
    LS_TRY(pol->p.fam->state_plan(&plan, pol->cfg, P, o->page_size, o->state_dtype, N, o->fwd.cp_layout,
                                  ls_grpo_sweep_chunk(o)));
    size_t grad, fixed;
    pol->p.fam->policy_predict(&pol->p, optimizer, &grad, &fixed);
    /* the reference's state sits beside the policy's when β > 0 (rollouts) */
    double prompt = o->no_capture ? 0.0 : (double)plan.total_bytes_per_rank * (o->beta != 0 ? 2.0 : 1.0);
    return fits("a prompt", P, &plan, prompt, fixed, grad, N,
                "shorten the prompt, use more ranks (mpirun -np N) or --state-dtype bf16, or pass --force");
}

ls_status ls_check_fits_eval(const ls_model *m, const ls_score_opts *so, int64_t P, size_t fixed) {
    if (P < 1) return LS_OK;
    const ls_comm *cp = so->fwd.comm;
    int N = cp ? ls_comm_size(cp) : 1;
    ls_state_plan_t plan;
    LS_TRY(m->fam->state_plan(&plan, ls_model_config(m), P, so->page_size, so->state_dtype, N, so->fwd.cp_layout, 0));
    return fits("an evaluation prompt", P, &plan, (double)plan.total_bytes_per_rank, fixed, 0, N,
                "shorten --prompt-len, use more ranks (mpirun -np N) or --state-dtype bf16, or pass --force");
}

/* "k": v, or "k": null for NaN / Inf (which JSON cannot spell) */
static void json_field(FILE *f, const char *k, double v) {
    if (isfinite(v)) fprintf(f, "\"%s\": %.10g", k, v);
    else fprintf(f, "\"%s\": null", k);
}

/* "    key: value" lines, comma-separated (ls_grpo_metrics_each's put) */
typedef struct {
    FILE *f;
    int first;
} metric_lines;
static void put_line(void *user, const char *k, double v) {
    metric_lines *ml = user;
    fputs(ml->first ? "  " : ",\n  ", ml->f);
    json_field(ml->f, k, v);
    ml->first = 0;
}

ls_status ls_receipt_write(const char *path, const char *cmd, const ls_trainable *pol, const ls_group *g,
                            const ls_grpo_opts *o, const ls_grpo_metrics *mt, const ls_arenas *ar) {
    const ls_comm *comm = o->fwd.comm;
    int N = comm ? ls_comm_size(comm) : 1;
    /* every rank's hash of the trainable tensors and prompt-arena peak (collective) */
    uint64_t h = ls_params_hash(pol->p.be, pol->p.w, pol->p.n), *hs = calloc((size_t)N, sizeof *hs);
    uint64_t pk = ar->a[LS_ARENA_PROMPT].peak, *pks = calloc((size_t)N, sizeof *pks);
    uint64_t rss = ls_peak_rss_bytes(), *rsss = calloc((size_t)N, sizeof *rsss);
    if (!hs || !pks || !rsss) {
        free(hs), free(pks), free(rsss);
        return ls_err(LS_ERR_NOMEM, "%s: cannot gather %d ranks' numbers", path, N);
    }
    ls_status cs = LS_OK;
    if (comm) {
        cs = ls_comm_allgather(comm, &h, hs, sizeof h);
        if (cs == LS_OK) cs = ls_comm_allgather(comm, &pk, pks, sizeof pk);
        if (cs == LS_OK) cs = ls_comm_allgather(comm, &rss, rsss, sizeof rss);
    } else {
        hs[0] = h, pks[0] = pk, rsss[0] = rss;
    }
    /* rank 0 alone writes: of the CP group, and with --ep of the EP group too (world rank 0) */
    int writer = (!comm || ls_comm_rank(comm) == 0) && (!pol->p.ep || ls_comm_rank(pol->p.ep) == 0);
    if (cs != LS_OK || !writer) {
        free(hs), free(pks), free(rsss);
        return cs;
    }
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen); /* built in memory, written atomically */
    if (!f) return ls_err(LS_ERR_NOMEM, "%s: cannot build the receipt", path);
    ls_state_plan_t plan;
    pol->p.fam->state_plan(&plan, pol->cfg, g->P, o->page_size, o->state_dtype, N, o->fwd.cp_layout, ls_grpo_sweep_chunk(o));
    size_t pgrad, pfixed;
    pol->p.fam->policy_predict(&pol->p, strcmp(cmd, "grad") != 0, &pgrad, &pfixed);
    const char *mode = o->no_capture ? (o->full ? "naive-full" : "naive") : (o->full ? "full" : "prefix-frozen");
    fprintf(f, "{\n  \"command\": \"%s\",\n  \"mode\": \"%s\",\n  \"loss\": \"%s\",\n", cmd, mode,
            o->sft ? "sft" : "grpo");
    if (o->full && !o->no_capture)
        fprintf(f, "  \"sweep_chunk\": %lld,\n  \"sweep_chunks\": %lld,\n", (long long)o->sweep_chunk,
                (long long)plan.sweep_chunks_per_rank);
    fprintf(f, "  \"P\": %d,\n  \"G\": %d,\n  \"R\": [", mt->P, mt->G);
    for (int i = 0; i < g->G; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)g->R[i]);
    fprintf(f, "],\n  \"phases_s\": {\"reference\": %.6f, \"capture\": %.6f, \"score\": %.6f, \"replay\": %.6f, "
               "\"sweep\": %.6f, \"optimize\": %.6f, \"total\": %.6f},\n",
            mt->t_ref, mt->t_capture, mt->t_score, mt->t_replay, mt->t_sweep, mt->t_optim, mt->t_total);
    fprintf(f, "  \"arena_peak_bytes\": {");
    for (int a = 0; a < LS_ARENA_COUNT; a++)
        fprintf(f, "%s\"%s\": %zu", a ? ", " : "", ls_arena_id_name((ls_arena_id)a), ar->a[a].peak);
    fprintf(f, "},\n");
    /* per device (each arena's memory is its backend's): the arenas on it and the sum of
     * their peaks (a bound: the peaks need not coincide) */
    fprintf(f, "  \"arena_device\": {");
    for (int a = 0; a < LS_ARENA_COUNT; a++)
        fprintf(f, "%s\"%s\": \"%s\"", a ? ", " : "", ls_arena_id_name((ls_arena_id)a), ls_arena_device(&ar->a[a]));
    /* an arena on a device keeps its host bookkeeping (page tables, layer structs) in a
     * host part: those bytes count for the host */
    fprintf(f, "},\n  \"arena_host_part_peak_bytes\": {");
    for (int a = 0; a < LS_ARENA_COUNT; a++)
        fprintf(f, "%s\"%s\": %zu", a ? ", " : "", ls_arena_id_name((ls_arena_id)a), ls_arena_host_peak(&ar->a[a]));
    fprintf(f, "},\n  \"device_peak_bytes\": {");
    const char *dev[LS_ARENA_COUNT + 1];
    size_t sum[LS_ARENA_COUNT + 1];
    int nd = 0;
    for (int a = 0; a <= LS_ARENA_COUNT; a++) { /* each arena's device, then "host" for the host parts */
        const char *d = a < LS_ARENA_COUNT ? ls_arena_device(&ar->a[a]) : "host";
        size_t add = 0;
        if (a < LS_ARENA_COUNT) add = ar->a[a].peak;
        else
            for (int b = 0; b < LS_ARENA_COUNT; b++) add += ls_arena_host_peak(&ar->a[b]);
        int k = 0;
        while (k < nd && strcmp(dev[k], d)) k++;
        if (k == nd) {
            if (a == LS_ARENA_COUNT && add == 0) break; /* no host part: nothing to add */
            dev[nd] = d, sum[nd++] = 0;
        }
        sum[k] += add;
    }
    for (int k = 0; k < nd; k++) fprintf(f, "%s\"%s\": %zu", k ? ", " : "", dev[k], sum[k]);
    fprintf(f, "},\n");
    if (o->full && !o->no_capture) { /* the reverse sweep's own peaks (full mode) */
        fprintf(f, "  \"sweep_peak_bytes\": {");
        for (int a = 0; a < LS_ARENA_COUNT; a++)
            fprintf(f, "%s\"%s\": %zu", a ? ", " : "", ls_arena_id_name((ls_arena_id)a), mt->sweep_peak[a]);
        fprintf(f, "},\n");
    }
    fprintf(f, "  \"process_peak_rss_bytes\": %zu,\n", ls_peak_rss_bytes());
    /* the BLAS and the kernels it ran (runtime.h): a receipt from a machine whose BLAS
     * fell back to weak kernels says so, with the rate they reach */
    ls_blas_info bi;
    ls_blas_info_get(&bi);
    fprintf(f, "  \"blas\": {\"config\": \"%s\", \"core\": \"%s\", \"chosen_by\": \"%s\", \"blas_own_core\": \"%s\", "
               "\"cpu_best_core\": \"%s\", \"weaker_than_cpu\": %s, \"threads\": %d, ",
            bi.config, bi.core, bi.source, bi.blas_core, bi.cpu_core, bi.weaker ? "true" : "false", ls_get_threads());
    json_field(f, "sgemm_gflops", ls_blas_sgemm_gflops());
    fputs("},\n", f);
    /* per rank (DESIGN §8): prompt arena peak beside the plan's per-rank prediction, peak
     * RSS, and the trainable tensors' hash (identical on every rank after a step) */
    fprintf(f, "  \"cp\": %d,\n  \"ep\": %d,\n  \"cp_layout\": \"%s\",\n  \"ranks\": [", N,
            pol->p.ep ? ls_comm_size(pol->p.ep) : 1, ls_cp_layout_name(o->fwd.cp_layout));
    for (int r = 0; r < N; r++)
        fprintf(f, "%s{\"rank\": %d, \"prompt_peak_bytes\": %llu, \"prompt_predicted_bytes\": %zu, "
                   "\"peak_rss_bytes\": %llu, \"trainable_hash\": \"%016llx\"}",
                r ? ", " : "", r, (unsigned long long)pks[r], o->no_capture ? (size_t)0 : plan.total_bytes_per_rank,
                (unsigned long long)rsss[r], (unsigned long long)hs[r]);
    fprintf(f, "],\n");
    free(hs), free(pks), free(rsss);
    { /* the prompt state's bytes by memory (issue 33): where it lives — the device of an
       * arena on a device backend (its page tables in the arena's host part), or host
       * memory, with --state-on host one layer's stage on the device — predicted beside
       * measured. On the CPU backend all of it is host memory. */
        const ls_arena *pa = &ar->a[LS_ARENA_PROMPT];
        const ls_backend *pbe = ls_arena_backend(pa), *obe = ls_arena_backend(&ar->a[LS_ARENA_SCRATCH]);
        size_t pd = 0, ph = 0, md = 0, mh = 0;
        const char *where;
        if (!pbe->host_mem) { /* on the device */
            where = "device";
            ls_state_placement(&plan, pol->cfg, o->state_dtype, N, 0, &pd, &ph);
            md = pa->peak, mh = ls_arena_host_peak(pa);
        } else if (obe->host_mem) { /* the CPU: host memory is the ops' memory */
            where = "host";
            ph = plan.total_bytes_per_rank, mh = pa->peak;
        } else { /* --state-on host: staged to the device a layer at a time */
            where = "host, staged";
            size_t sh;
            ls_state_placement(&plan, pol->cfg, o->state_dtype, N, 1, &pd, &ph);
            ls_state_stage_peak_made(&md, &sh);
            mh = pa->peak + sh;
        }
        if (o->no_capture) pd = ph = 0; /* no prompt state */
        fprintf(f, "  \"prompt_state_bytes\": {\"memory\": \"%s\", \"predicted\": {\"device\": %zu, \"host\": %zu}, "
                   "\"measured\": {\"device\": %zu, \"host\": %zu}},\n", where, pd, ph, md, mh);
    }
    /* M_live terms (DESIGN §1): predicted from the config beside measured */
    fprintf(f, "  \"m_live\": {\n"
               "    \"prompt\": {\"predicted\": %zu, \"measured\": %zu},\n"
               "    \"grad\": {\"predicted_min\": %zu, \"measured\": %zu},\n"
               "    \"fixed\": {\"predicted_min\": %zu, \"measured\": %zu},\n"
               "    \"branch\": {\"measured\": %zu},\n    \"score\": {\"measured\": %zu},\n"
               "    \"scratch\": {\"measured\": %zu}\n  },\n",
            o->no_capture ? (size_t)0 : plan.total_bytes_per_rank, ar->a[LS_ARENA_PROMPT].peak, pgrad,
            ar->a[LS_ARENA_GRAD].peak, pfixed, ar->a[LS_ARENA_FIXED].peak,
            ar->a[LS_ARENA_BRANCH].peak, ar->a[LS_ARENA_SCORE].peak, ar->a[LS_ARENA_SCRATCH].peak);
    fprintf(f, "  \"iterations\": [");
    for (int i = 0; i < mt->n_iter && i < 64; i++) {
        fprintf(f, "%s{", i ? ", " : "");
        json_field(f, "loss", mt->iter_loss[i]);
        fputs(", ", f);
        json_field(f, "grad_norm", mt->iter_grad_norm[i]);
        fputc('}', f);
    }
    fprintf(f, "],\n");
    fprintf(f, "  \"metrics\": {\n");
    metric_lines ml = {f, 1};
    ls_grpo_metrics_each(mt, 1, o->aux_loss_coef > 0 ? pol->p.fam->aux_loss : NULL, put_line, &ml);
    fprintf(f, "\n  }\n}\n");
    return ls_write_memstream(path, f, &buf, &blen);
}
