# `_llm` for CMake-based MicroPython ports (the esp32 port):
#   make -C ports/esp32 BOARD_DIR=<repo>/firmware/boards/MPLLM_N16R8 \
#        USER_C_MODULES=<repo>/native/micropython/micropython.cmake
# On the ESP32-S3 the engine runs the PIE kernels natively, on the esp32 port
# layer (partition mmap, heap_caps placement, core-0 worker). Make-based ports
# (unix) use micropython.mk beside this file instead.

get_filename_component(LLM_NATIVE_DIR ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)

if(NOT IDF_TARGET STREQUAL "esp32s3")
    message(FATAL_ERROR "mpllm's _llm is built for the ESP32-S3 (its PIE kernels and "
        "port layer); IDF_TARGET is '${IDF_TARGET}'")
endif()

# The engine's one source list (native/engine/sources.txt), plus the PIE
# kernels and the kernel self-test behind _llm.selftest().
file(STRINGS ${LLM_NATIVE_DIR}/engine/sources.txt LLM_ENGINE_SOURCES REGEX "^[^#]")
list(TRANSFORM LLM_ENGINE_SOURCES PREPEND ${LLM_NATIVE_DIR}/engine/)
set(LLM_DEVICE_SOURCES
    ${LLM_NATIVE_DIR}/binding/llm_bind.c
    ${LLM_NATIVE_DIR}/engine/kernels_pie.c
    ${LLM_NATIVE_DIR}/engine/selftest.c
    ${LLM_NATIVE_DIR}/port/esp32/port_esp32.c
)

add_library(usermod_llm INTERFACE)

target_sources(usermod_llm INTERFACE
    ${CMAKE_CURRENT_LIST_DIR}/modllm.c
    ${CMAKE_CURRENT_LIST_DIR}/modllm_call.c
    ${LLM_ENGINE_SOURCES}
    ${LLM_DEVICE_SOURCES}
)

target_include_directories(usermod_llm INTERFACE
    ${CMAKE_CURRENT_LIST_DIR}
    ${LLM_NATIVE_DIR}/engine
    ${LLM_NATIVE_DIR}/binding
    ${LLM_NATIVE_DIR}/port/esp32
)

# The engine's float order is its bit-exact contract (no fused multiply-add,
# which the S3 FPU has), the PIE kernels are emitted natively, the functions a
# token runs go to internal instruction RAM (native/engine/hot.h: ESP-IDF's
# linker script places `.iram1.*` there), and build_info() names the port. These go on the interface, not on the source
# files: the esp32 port compiles user-module sources twice (in the `main`
# component and again for micropython.elf, whose objects are the ones linked),
# and source-file properties are directory-scoped, so they missed the second
# compile. The consequence is that all of MicroPython's main component is also
# built with -ffp-contract=off (plain IEEE operations, a little slower float
# code there) and sees these LLM_* macros, which nothing else uses.
target_compile_options(usermod_llm INTERFACE -ffp-contract=off)
target_compile_definitions(usermod_llm INTERFACE
    LLM_KERNELS_PIE
    LLM_PIE_NATIVE
    LLM_HOT_SECTION=".iram1.llm"
    LLM_PORT_NAME="esp32"
)

target_link_libraries(usermod INTERFACE usermod_llm)
