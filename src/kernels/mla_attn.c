/*
 * mla_attn.c — sparse MLA attention in the absorbed ("MQA") form
 * (specs/mla-dsa-moe.md §2 "Absorbed", §3 "Top-k"): one shared key row per position,
 * [c_kv (rkv) ; k_pe (dr)], which is also the value (its first rkv values); each
 * head's query is [q̃ = W_UKᵀ q_nope ; q_pe]. A query attends only to the positions
 * its indexer selected. Keys of positions below pos0 come from pages (the prompt
 * state), the others from the call's own rows.
 */
#include <math.h>
#include <string.h>

#include "longstraw/kernels.h"

/* The key row of position p: a page row (converted into tmp) or an own row. */
static const float *key_row(const ls_kv_prefix *pf, const float *own, int64_t pos0, int64_t p, int dk, float *tmp) {
    if (p >= pos0) return own + (p - pos0) * dk;
    const char *page = (const char *)pf->k_pages[p / pf->page_size];
    size_t off = (size_t)(p % pf->page_size) * (size_t)dk * ls_dtype_size(pf->dtype);
    ls_convert_to_f32(tmp, page + off, pf->dtype, (size_t)dk);
    return tmp;
}

ls_status ls_mla_attn_fwd(float *o, float *lse, const float *q, const float *own, const ls_kv_prefix *prefix,
                          const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0, float scale) {
    const int dk = rkv + dr;
    LS_ASSERT(dk <= 4096, "MLA key row of %d values", dk);
#pragma omp parallel for schedule(dynamic, 4) if (T > 4)
    for (int64_t t = 0; t < T; t++) {
        float tmp[4096];
        const int32_t *st = sel + t * k;
        for (int h = 0; h < H; h++) {
            const float *qh = q + (t * H + h) * dk;
            float *oh = o + (t * H + h) * rkv;
            double m = -INFINITY, l = 0, acc[4096];
            for (int d = 0; d < rkv; d++) acc[d] = 0;
            for (int64_t j = 0; j < k && st[j] >= 0; j++) { /* online softmax over the selected keys */
                const float *kr = key_row(prefix, own, pos0, st[j], dk, tmp);
                double s = 0;
                for (int d = 0; d < dk; d++) s += (double)qh[d] * kr[d];
                s *= scale;
                double mn = s > m ? s : m, c = exp(m - mn), e = exp(s - mn);
                l = l * c + e;
                for (int d = 0; d < rkv; d++) acc[d] = acc[d] * c + e * kr[d];
                m = mn;
            }
            for (int d = 0; d < rkv; d++) oh[d] = l > 0 ? (float)(acc[d] / l) : 0.0f;
            if (lse) lse[t * H + h] = l > 0 ? (float)(m + log(l)) : -INFINITY;
        }
    }
    return LS_OK;
}

ls_status ls_mla_attn_bwd(float *dq, float *down, void *const *dprefix, const float *dout, const float *o,
                          const float *lse, const float *q, const float *own, const ls_kv_prefix *prefix,
                          const int32_t *sel, int64_t k, int64_t T, int H, int rkv, int dr, int64_t pos0,
                          float scale) {
    const int dk = rkv + dr;
    memset(dq, 0, (size_t)(T * H * dk) * sizeof(float));
    if (down) memset(down, 0, (size_t)(T * dk) * sizeof(float));
    /* Serial over queries: key gradients of different queries meet on the same rows. */
    float tmp[4096];
    LS_ASSERT(dk <= 4096, "MLA key row of %d values", dk);
    for (int64_t t = 0; t < T; t++) {
        const int32_t *st = sel + t * k;
        for (int h = 0; h < H; h++) {
            const float *qh = q + (t * H + h) * dk, *oh = o + (t * H + h) * rkv, *gh = dout + (t * H + h) * rkv;
            float *dqh = dq + (t * H + h) * dk;
            double D = 0; /* rowsum(dO ⊙ O) */
            for (int d = 0; d < rkv; d++) D += (double)gh[d] * oh[d];
            for (int64_t j = 0; j < k && st[j] >= 0; j++) {
                int64_t p = st[j];
                const float *kr = key_row(prefix, own, pos0, p, dk, tmp);
                double s = 0, dp = 0;
                for (int d = 0; d < dk; d++) s += (double)qh[d] * kr[d];
                double P = exp(s * scale - (double)lse[t * H + h]);
                for (int d = 0; d < rkv; d++) dp += (double)gh[d] * kr[d];
                double ds = P * (dp - D) * scale;
                for (int d = 0; d < dk; d++) dqh[d] += (float)(ds * kr[d]);
                float *dk_row = p >= pos0 ? (down ? down + (p - pos0) * dk : NULL)
                                          : (dprefix ? (float *)dprefix[p / prefix->page_size] +
                                                           (p % prefix->page_size) * dk
                                                     : NULL);
                if (!dk_row) continue;
                for (int d = 0; d < dk; d++) dk_row[d] += (float)(ds * qh[d]);
                for (int d = 0; d < rkv; d++) dk_row[d] += (float)(P * gh[d]); /* the value is c_kv */
            }
        }
    }
    return LS_OK;
}
