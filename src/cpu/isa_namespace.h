// The headers that the per-ISA kernel builds include put their definitions in an inline namespace named
// after the ISA (isa_scalar, isa_avx2, isa_avx512, ...). The copies of an inline function compiled with
// different instruction sets then carry different symbol names, so the linker can never keep, say, the
// AVX-512 copy of write_output_rows for the code that runs on an AVX2 CPU (an ODR violation that showed up
// as SIGILL once the bf16 kernel sets were added). Outside the kernel builds (FT_ISA_NS undefined) the
// namespace is isa_portable. Inline: code names everything as before (cpu::padded, simd::load, ...).
#pragma once

#define FT_ISA_CAT2(a, b) a##b
#define FT_ISA_CAT(a, b) FT_ISA_CAT2(a, b)
#if defined(FT_ISA_NS)
#define FT_ISA_BEGIN inline namespace FT_ISA_CAT(isa_, FT_ISA_NS) {
#else
#define FT_ISA_BEGIN inline namespace isa_portable {
#endif
#define FT_ISA_END }
