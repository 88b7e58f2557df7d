// train_ckpt_internal.h — what the save (train_ckpt.c) and the restore (train_restore.c) share.
#pragma once
#include <stddef.h>

#include "model.h"

// The checkpoint name of state `which` of tensor `name`: 0 the fp32 master (the name itself),
// 1 Adam's m ("optim.exp_avg." + name), 2 Adam's v ("optim.exp_avg_sq." + name).
void ckpt_state_name(char* out, size_t n, int which, const char* name);
// Zeroes both gradient arenas (between steps they are zero; save and restore stage through them).
void trainer_zero_grads(Model* m);
