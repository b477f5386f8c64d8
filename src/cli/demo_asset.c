/*
 * demo_asset.c — the demo's starting checkpoint, embedded in the binary when the build
 * found assets/demo-sft.tar.xz (CMakeLists.txt extracts it and defines LS_DEMO_SFT_DIR,
 * the extracted model.safetensors and config.json): a small hybrid model
 * taught the passkey task at a short prompt by supervised fine-tuning
 * (scripts/make-demo-sft.sh reproduces it). `longstraw demo` writes it to OUT/model/.
 */
#include "demo_asset.h"

#ifdef LS_DEMO_SFT_DIR
__asm__(".section .rodata\n"
        ".balign 64\n"
        ".globl ls_demo_sft_model\n"
        "ls_demo_sft_model:\n"
        ".incbin \"" LS_DEMO_SFT_DIR "/model.safetensors\"\n"
        ".globl ls_demo_sft_model_end\n"
        "ls_demo_sft_model_end:\n"
        ".balign 64\n"
        ".globl ls_demo_sft_config\n"
        "ls_demo_sft_config:\n"
        ".incbin \"" LS_DEMO_SFT_DIR "/config.json\"\n"
        ".globl ls_demo_sft_config_end\n"
        "ls_demo_sft_config_end:\n"
        ".byte 0\n"
        ".previous\n");

extern const unsigned char ls_demo_sft_model[], ls_demo_sft_model_end[];
extern const unsigned char ls_demo_sft_config[], ls_demo_sft_config_end[];

int ls_demo_sft(ls_demo_blob *model, ls_demo_blob *config) {
    model->data = ls_demo_sft_model, model->len = (size_t)(ls_demo_sft_model_end - ls_demo_sft_model);
    config->data = ls_demo_sft_config, config->len = (size_t)(ls_demo_sft_config_end - ls_demo_sft_config);
    return 1;
}
#else
int ls_demo_sft(ls_demo_blob *model, ls_demo_blob *config) {
    model->data = config->data = 0;
    model->len = config->len = 0;
    return 0;
}
#endif
