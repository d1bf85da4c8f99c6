# GGML_NATIVE enables AMX where the CPU has it, and ggml's AMX mat-mul segfaults on the machines llama-tq is
# built on (every model run dies at the first AMX instruction): keep native code generation but without the
# AMX tile instructions. The one place this workaround lives: CMakeLists.txt includes it, and
# scripts/patch_and_build.sh passes it to a plain llama.cpp build as CMAKE_PROJECT_INCLUDE.
include_guard(GLOBAL)
include(CheckCCompilerFlag)
check_c_compiler_flag("-mno-amx-tile" LLAMA_TQ_HAS_NO_AMX)
if (LLAMA_TQ_HAS_NO_AMX)
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-mno-amx-tile;-mno-amx-int8;-mno-amx-bf16>")
endif()
