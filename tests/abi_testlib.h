// Shared checks for the tests of libcgspn's C ABI (kernels/cgspn.h): the C-GSPN scan
// (test_cgspn_abi.c) and GSPN-1's gate recurrence (test_gate_recurrent.c).
#pragma once
#include "testlib.h"
#include "../kernels/cgspn.h"

// A CUDA call given host memory is refused whatever the build: with a GPU, the pointers are not
// device memory; without one, the pointer query fails (CGSPN_ERR_CUDA); a build without CUDA says
// so (CGSPN_ERR_UNSUPPORTED). st: what the call returned.
static inline void assert_cuda_on_host_refused(int st) {
    printf("    cuda_available=%d: fwd on host memory -> %d (%s)\n", cgspn_cuda_available(), st,
           cgspn_last_error());
    if (cgspn_cuda_available())
        assert_int_equal(st, CGSPN_ERR_BAD_DEVICE);
    else
        assert_true(st == CGSPN_ERR_UNSUPPORTED || st == CGSPN_ERR_CUDA);
}
