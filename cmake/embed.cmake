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
