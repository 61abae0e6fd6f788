# Warnings as an interface target; -Werror only when asked for (CI).
add_library(fencerun_warnings INTERFACE)
target_compile_options(fencerun_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wunused
  -Woverloaded-virtual -Wnull-dereference -Wformat=2 -Wimplicit-fallthrough)
if(FENCERUN_WERROR)
  target_compile_options(fencerun_warnings INTERFACE -Werror)
endif()
