# gRPC C++ from the system packages, for every CMake project of the repository
# (the native module, bench/transport_floor). Debian's gRPC config imports
# grpc_cpp_plugin (grpc#38838) and links protobuf's library, neither of which
# libgrpc++-dev depends on: without all three packages the build stops here,
# naming them, rather than later in gRPC's own config or at link time.
set(RECSTORE_GRPC_APT_PACKAGES libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc)
list(JOIN RECSTORE_GRPC_APT_PACKAGES " " _recstore_grpc_packages)
string(CONCAT _recstore_grpc_hint
       "gRPC C++ is required: install the system packages ${_recstore_grpc_packages} "
       "(apt-get install ${_recstore_grpc_packages}, or `make system-deps`)")
find_program(RECSTORE_GRPC_CPP_PLUGIN grpc_cpp_plugin)
if(NOT RECSTORE_GRPC_CPP_PLUGIN)
  message(FATAL_ERROR "${_recstore_grpc_hint}: grpc_cpp_plugin was not found")
endif()
find_package(gRPC CONFIG QUIET)
if(NOT gRPC_FOUND)
  message(FATAL_ERROR "${_recstore_grpc_hint}: find_package(gRPC CONFIG) found no gRPCConfig.cmake")
endif()
if(NOT TARGET protobuf::libprotobuf)
  message(FATAL_ERROR "${_recstore_grpc_hint}: gRPC's config found no protobuf library")
endif()
message(STATUS "gRPC C++ ${gRPC_VERSION}: ${gRPC_DIR}")
