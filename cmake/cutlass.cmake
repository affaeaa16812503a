# flashtile_find_cutlass(<out-var>): the include directory holding cute/ and cutlass/, from
# -DCUTLASS_DIR=<checkout or include dir> or from the pip package nvidia-cutlass (pinned 4.2.0.0, installed
# with --no-deps; its headers are under cutlass_library/source/include), imported by python3 or by the venv
# of scripts/setup.sh ($FLASHTILE_VENV, default ~/.cache/flashtile/venv). Empty when not found.
function(flashtile_find_cutlass out)
  set(CUTLASS_DIR "${CUTLASS_DIR}" CACHE PATH "CUTLASS checkout or include directory (holds cute/)")
  foreach(cand "${CUTLASS_DIR}/include" "${CUTLASS_DIR}")
    if(CUTLASS_DIR AND EXISTS "${cand}/cute/tensor.hpp" AND EXISTS "${cand}/cutlass/numeric_types.h")
      set(${out} "${cand}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  # python3 first; then the venv scripts/setup.sh installs into when python3 cannot take packages (PEP 668).
  find_package(Python3 COMPONENTS Interpreter QUIET)
  set(pythons "")
  if(Python3_Interpreter_FOUND)
    list(APPEND pythons "${Python3_EXECUTABLE}")
  endif()
  if(DEFINED ENV{FLASHTILE_VENV})
    list(APPEND pythons "$ENV{FLASHTILE_VENV}/bin/python")
  elseif(DEFINED ENV{HOME})
    list(APPEND pythons "$ENV{HOME}/.cache/flashtile/venv/bin/python")
  endif()
  foreach(py IN LISTS pythons)
    if(NOT EXISTS "${py}")
      continue()
    endif()
    execute_process(
      COMMAND "${py}" -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND EXISTS "${inc}/cute/tensor.hpp")
      set(${out} "${inc}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()
