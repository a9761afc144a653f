# `_llm` for make-based MicroPython ports (the unix port), where USER_C_MODULES
# names the directory holding this one: USER_C_MODULES=<repo>/native.
# The engine runs on the host port layer (file mmap, malloc placement) with the
# scalar kernels, as in the CPython `_llm`; the board build is micropython.cmake.
# USERMOD_DIR is $(USER_C_MODULES)/micropython; objects are named after the
# path below USER_C_MODULES, so the engine's land in $(BUILD)/engine/.
LLM_NATIVE_DIR := $(patsubst %/micropython,%,$(USERMOD_DIR))

# Scanned for QSTRs: the binding only.
SRC_USERMOD_C += $(USERMOD_DIR)/modllm.c $(USERMOD_DIR)/modllm_call.c

# The engine's one source list (comments start with #).
LLM_ENGINE_SOURCES := $(shell grep -v '^\#' $(LLM_NATIVE_DIR)/engine/sources.txt)
SRC_USERMOD_LIB_C += $(addprefix $(LLM_NATIVE_DIR)/engine/,$(LLM_ENGINE_SOURCES))
SRC_USERMOD_LIB_C += $(LLM_NATIVE_DIR)/port/host/port_host.c
SRC_USERMOD_LIB_C += $(LLM_NATIVE_DIR)/binding/llm_bind.c
# _llm.selftest(): the PIE kernels through the host model against the reference
SRC_USERMOD_LIB_C += $(addprefix $(LLM_NATIVE_DIR)/engine/,kernels_pie.c pie_model.c selftest.c)

CFLAGS_USERMOD += -I$(USERMOD_DIR) -I$(LLM_NATIVE_DIR)/engine -I$(LLM_NATIVE_DIR)/port/host
CFLAGS_USERMOD += -I$(LLM_NATIVE_DIR)/binding
CFLAGS_USERMOD += -DLLM_PORT_NAME='"micropython-unix"'
# The tests' builds: SIGINT forced at named points (modllm_platform.h, mpllm_test_point).
ifeq ($(MPLLM_TEST_HOOKS),1)
CFLAGS_USERMOD += -DMPLLM_TEST_HOOKS=1
endif

# The engine's float order is its bit-exact contract: no fused multiply-add,
# anywhere it is compiled (docs/ARCHITECTURE.md, the numerics contract). It is C11 and built warning-clean with
# its own flags; MicroPython's stricter float-conversion warnings are for
# MicroPython's code.
$(BUILD)/engine/%.o $(BUILD)/port/host/%.o $(BUILD)/binding/%.o: CFLAGS += -std=c11 -ffp-contract=off -Wno-double-promotion -Wno-float-conversion
$(BUILD)/micropython/modllm.o $(BUILD)/micropython/modllm_call.o: CFLAGS += -ffp-contract=off

# Objects are named after their path below USER_C_MODULES, so this module's
# land in $(BUILD)/micropython/, which is also the unix port's program path.
# Rename the program rather than fail at link time.
ifeq ($(PROG),micropython)
PROG := micropython-llm
$(info _llm: the interpreter is built as $(BUILD)/$(PROG) ($(BUILD)/micropython/ holds this module's objects))
endif
