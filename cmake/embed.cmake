# msinfer_embed_text(TARGET_VAR INPUT SYMBOL OUTPUT): generates a header that holds the
# text of INPUT as `inline constexpr std::string_view SYMBOL`, regenerated when INPUT changes.
function(msinfer_embed_text input symbol output)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${input} -DOUTPUT=${output} -DSYMBOL=${symbol}
            -P ${PROJECT_SOURCE_DIR}/cmake/embed_run.cmake
    DEPENDS ${input} ${PROJECT_SOURCE_DIR}/cmake/embed_run.cmake
    COMMENT "Embedding ${input}")
endfunction()

# msinfer_embed_files(OUTPUT FUNCTION FILE...): generates OUTPUT, a C++ source that
# holds the bytes of each FILE (any content: binary too) in .rodata through the
# assembler's .incbin, and defines `std::vector<msinfer::embedded::File> FUNCTION()`
# (include/msinfer/core/embedded_file.h) listing them by file name. .incbin costs
# the compiler nothing (a 5 MB array written out as C source took seconds and
# hundreds of MB of memory to compile). The source is regenerated when a FILE
# changes and names each file's SHA-256 in a string (comments do not survive
# the preprocessor), so a compiler cache that hashes the preprocessed source,
# not the files an .incbin reads, cannot serve a stale object (ccache declines
# to cache .incbin anyway).
function(msinfer_embed_files output function)
  string(REPLACE ";" "|" files "${ARGN}")  # one argument through the shell
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${output} -DFUNCTION=${function} -DFILES=${files}
            -P ${PROJECT_SOURCE_DIR}/cmake/embed_files_run.cmake
    DEPENDS ${ARGN} ${PROJECT_SOURCE_DIR}/cmake/embed_files_run.cmake
    COMMENT "Embedding ${function}"
    VERBATIM)
endfunction()
