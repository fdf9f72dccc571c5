# CMake toolchain file: Arm Cortex-M bare metal (no OS, no file system) with the GNU Arm
# Embedded toolchain and newlib (Debian/Ubuntu: apt-get install gcc-arm-none-eabi
# libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib). Use it with -DETB_BARE_METAL=ON.
#
#   cmake -S runtime_src -B build/m4 -G Ninja -DETB_BARE_METAL=ON \
#         -DCMAKE_TOOLCHAIN_FILE=runtime_src/cmake/cortex_m.cmake
#
# Settings (cache variables; the defaults are a Cortex-M4F):
#   ETB_ARM_TOOLCHAIN_PREFIX  the tools' prefix, with a folder or not (arm-none-eabi-)
#   ETB_ARM_CPU               -mcpu (cortex-m4)
#   ETB_ARM_FPU               -mfpu (fpv4-sp-d16; empty: none, for float ABI soft)
#   ETB_ARM_FLOAT_ABI         -mfloat-abi: soft, softfp or hard (hard)
# Executables link against newlib-nano with stubbed system calls (nano.specs, nosys.specs)
# and drop unreferenced sections (--gc-sections); a real firmware adds its board's startup
# code and linker script.
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
# No OS to link a test program against: try-compile checks build a static library.
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES ETB_ARM_TOOLCHAIN_PREFIX ETB_ARM_CPU ETB_ARM_FPU
     ETB_ARM_FLOAT_ABI)

if(NOT DEFINED ETB_ARM_TOOLCHAIN_PREFIX)
  set(ETB_ARM_TOOLCHAIN_PREFIX arm-none-eabi-)
endif()
if(NOT DEFINED ETB_ARM_CPU)
  set(ETB_ARM_CPU cortex-m4)
endif()
if(NOT DEFINED ETB_ARM_FPU)
  set(ETB_ARM_FPU fpv4-sp-d16)
endif()
if(NOT DEFINED ETB_ARM_FLOAT_ABI)
  set(ETB_ARM_FLOAT_ABI hard)
endif()

set(CMAKE_C_COMPILER ${ETB_ARM_TOOLCHAIN_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${ETB_ARM_TOOLCHAIN_PREFIX}g++)
set(CMAKE_ASM_COMPILER ${ETB_ARM_TOOLCHAIN_PREFIX}gcc)
set(CMAKE_AR ${ETB_ARM_TOOLCHAIN_PREFIX}ar CACHE FILEPATH "archiver")
set(CMAKE_RANLIB ${ETB_ARM_TOOLCHAIN_PREFIX}ranlib CACHE FILEPATH "ranlib")
set(CMAKE_OBJCOPY ${ETB_ARM_TOOLCHAIN_PREFIX}objcopy CACHE FILEPATH "objcopy")
set(CMAKE_SIZE ${ETB_ARM_TOOLCHAIN_PREFIX}size CACHE FILEPATH "size")

set(_etb_arm_flags "-mcpu=${ETB_ARM_CPU} -mthumb -mfloat-abi=${ETB_ARM_FLOAT_ABI}")
if(ETB_ARM_FPU)
  string(APPEND _etb_arm_flags " -mfpu=${ETB_ARM_FPU}")
endif()
set(CMAKE_C_FLAGS_INIT "${_etb_arm_flags}")
set(CMAKE_CXX_FLAGS_INIT "${_etb_arm_flags}")
set(CMAKE_ASM_FLAGS_INIT "${_etb_arm_flags}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "-specs=nano.specs -specs=nosys.specs -Wl,--gc-sections")

# Host programs (Python, flatc) come from the build machine. The runtime finds no target
# libraries; the flatbuffers headers it compiles against are header-only.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
