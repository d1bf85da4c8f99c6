// FLASH_ATTN_EXT decode instances for K = tq4_96 (one file per K type keeps each compile short).
#include "tq-fattn.cuh"

TQ_FA_DEFINE_RUN(TQFA_TQ4_96)
