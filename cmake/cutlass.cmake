# flashtile_find_cutlass(<out-var>): the include directory holding cute/ and cutlass/, from
# -DCUTLASS_DIR=<checkout or include dir> or from the pip package nvidia-cutlass (pinned 4.2.0.0, installed
# with --no-deps; its headers are under cutlass_library/source/include). Empty when not found.
function(flashtile_find_cutlass out)
  set(CUTLASS_DIR "${CUTLASS_DIR}" CACHE PATH "CUTLASS checkout or include directory (holds cute/)")
  foreach(cand "${CUTLASS_DIR}/include" "${CUTLASS_DIR}")
    if(CUTLASS_DIR AND EXISTS "${cand}/cute/tensor.hpp" AND EXISTS "${cand}/cutlass/numeric_types.h")
      set(${out} "${cand}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND EXISTS "${inc}/cute/tensor.hpp")
      set(${out} "${inc}" PARENT_SCOPE)
      return()
    endif()
  endif()
  set(${out} "" PARENT_SCOPE)
endfunction()
