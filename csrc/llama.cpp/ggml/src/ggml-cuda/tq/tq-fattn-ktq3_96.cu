// FLASH_ATTN_EXT decode instances for K = tq3_96 (one file per K type keeps each compile short).
#include "tq-fattn.cuh"

TQ_FA_DEFINE_RUN(TQFA_TQ3_96)
