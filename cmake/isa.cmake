# Per-ISA translation units. Generic code is built for baseline x86-64 so the
# binary runs anywhere; each SIMD kernel file gets its own flags and is chosen
# at run time from CPUID (src/kernels/dispatch.cc).
set(K3_AVX2_FLAGS -mavx2 -mfma -mf16c)
set(K3_AVX512_FLAGS -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c)
# The int8 VNNI kernel only (x86/avx512_vnni.cc), chosen when CPUID has it.
set(K3_AVX512VNNI_FLAGS ${K3_AVX512_FLAGS} -mavx512vnni)
# The bf16 dot-product GEMM only (x86/avx512_bf16.cc), chosen when CPUID has it.
set(K3_AVX512BF16_FLAGS ${K3_AVX512_FLAGS} -mavx512bf16)
# The AMX code (x86/avx512_amx.cc: the bf16 GEMM; the peak loops; the int8
# study), chosen when CPUID and the OS allow. No kernel uses AMX-INT8
# (docs/performance.md, "int8 on the tile unit"); sysinfo measures its peak.
set(K3_AMX_FLAGS ${K3_AVX512BF16_FLAGS} -mamx-tile -mamx-bf16 -mamx-int8)

function(k3_isa_sources target isa)
  if(isa STREQUAL "avx2")
    set(flags ${K3_AVX2_FLAGS})
  elseif(isa STREQUAL "avx512")
    set(flags ${K3_AVX512_FLAGS})
  elseif(isa STREQUAL "avx512vnni")
    set(flags ${K3_AVX512VNNI_FLAGS})
  elseif(isa STREQUAL "avx512bf16")
    set(flags ${K3_AVX512BF16_FLAGS})
  elseif(isa STREQUAL "amx")
    set(flags ${K3_AMX_FLAGS})
  else()
    message(FATAL_ERROR "unknown isa ${isa}")
  endif()
  foreach(src ${ARGN})
    set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${flags}")
  endforeach()
  target_sources(${target} PRIVATE ${ARGN})
endfunction()
