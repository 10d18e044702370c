# Warning flags applied to every K3 target through k3_set_warnings().
function(k3_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
endfunction()
