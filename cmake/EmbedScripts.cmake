# Turns src/lease/scripts/*.lua into a header with each script's text and SHA1,
# so EVALSHA needs no hashing at run time.
function(fencerun_embed_scripts out_header)
  set(body "// Generated from src/lease/scripts/*.lua by cmake/EmbedScripts.cmake. Do not edit.\n#pragma once\n#include <string_view>\n\nnamespace fencerun::lease::scripts {\n\nstruct Source {\n  std::string_view name;\n  std::string_view text;\n  std::string_view sha1;\n};\n\n")
  foreach(file IN LISTS ARGN)
    get_filename_component(name "${file}" NAME_WE)
    file(READ "${file}" text)
    string(SHA1 sha "${text}")
    string(APPEND body "inline constexpr Source k_${name}{\"${name}\", R\"fencerun_lua(${text})fencerun_lua\", \"${sha}\"};\n")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
  endforeach()
  string(APPEND body "\n}  // namespace fencerun::lease::scripts\n")
  file(CONFIGURE OUTPUT "${out_header}" CONTENT "${body}" @ONLY)
endfunction()
