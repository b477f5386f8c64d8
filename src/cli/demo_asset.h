/*
 * demo_asset.h — the demo's embedded starting checkpoint (demo_asset.c).
 */
#ifndef LONGSTRAW_CLI_DEMO_ASSET_H
#define LONGSTRAW_CLI_DEMO_ASSET_H

#include <stddef.h>

typedef struct {
    const unsigned char *data;
    size_t len;
} ls_demo_blob;

/* The embedded checkpoint's layers, for the demo's first line (scripts/make-demo-sft.sh
 * makes it from examples/recipe/hybrid.json). */
#define LS_DEMO_SFT_SUMMARY "2 Gated DeltaNet + 2 gated attention"

/* 1 and the embedded model.safetensors and config.json; 0 when this build has none. */
int ls_demo_sft(ls_demo_blob *model, ls_demo_blob *config);

#endif
