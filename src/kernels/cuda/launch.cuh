// Kernel launches and dynamic shared memory as macros, so that the same .cu files also compile as
// C++ against the CPU emulator of tests/cuda_emu (cuda_emu.h defines these first, with
// POSENC_CUDA_EMU). Under nvcc they are today's CUDA, token for token:
//   POSENC_LAUNCH(grid, block, shared, stream, kernel<T, N>)(args...)
//       == kernel<T, N><<<grid, block, shared, stream>>>(args...)
//   (the kernel last: a template-id's commas would split a macro argument anywhere else)
//   POSENC_EXTERN_SHARED(float, shared);  ==  extern __shared__ float shared[];
// scripts/check_ptx.sh checks that nvcc -ptx is byte-identical with and without them.
#pragma once

#ifndef POSENC_CUDA_EMU
#define POSENC_LAUNCH(grid, block, shared, stream, ...) __VA_ARGS__<<<grid, block, shared, stream>>>
#define POSENC_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif
