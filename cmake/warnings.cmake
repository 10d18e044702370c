# Warning flags applied to every K3 target through k3_set_warnings().
# With K3_WERROR (on in scripts/test.sh, so in CI) a warning fails the
# build: a printf format that read "% lo" from a message went unnoticed for
# a day as a warning. Two GCC 12 diagnostics stay warnings: they fire inside
# libstdc++ after inlining (-Wrestrict on char_traits' memcpy in the Release
# build; -Wmaybe-uninitialized in basic_string, and in std::regex's
# std::function states in the sanitizer build), known false positives of
# that compiler. The exemption covers K3's own code too, so these two are
# the warnings a change must still read in the build log.
option(K3_WERROR "Treat compiler warnings as errors" OFF)
function(k3_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(K3_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE -Wno-error=restrict -Wno-error=maybe-uninitialized)
    endif()
  endif()
endfunction()
