/* The one table of tests: LS_TEST_ENTRY(name) — `ls_tests name` runs one,
 * `ls_tests` runs all. CMake registers each entry with CTest. */
LS_TEST_ENTRY(core_arena)
LS_TEST_ENTRY(core_dtype)
LS_TEST_ENTRY(gdr_chunk_vs_serial)
LS_TEST_ENTRY(gdr_serial_vs_double)
LS_TEST_ENTRY(attn_tiled_vs_naive)
LS_TEST_ENTRY(attn_paged_bf16)
LS_TEST_ENTRY(safetensors_roundtrip)
LS_TEST_ENTRY(safetensors_reject)
LS_TEST_ENTRY(safetensors_sharded)
