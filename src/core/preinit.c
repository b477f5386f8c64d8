/*
 * preinit.c — the executable's .preinit_array entry of ls_runtime_hold_verbose (runtime.c):
 * compiled into each program that links liblongstraw.a (CMake adds it as an INTERFACE
 * source of that target), never into liblongstraw.so, where the linker refuses one.
 */
#include "longstraw/runtime.h"

__attribute__((section(".preinit_array"), used)) static void (*const ls_preinit_hold_verbose)(int, char **,
                                                                                               char **) =
    ls_runtime_hold_verbose;
