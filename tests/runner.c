/*
 * The one Check runner. Each test executable is this file plus one
 * tests/test_<module>.c, built with -DVKS_SUITE=<module>_suite; meson's test
 * harness runs them. Fork mode stays on so a crashing test is reported, not
 * fatal. Exit 77 (meson's "skipped") is left to suites that need a device
 * they cannot find.
 */
#include <check.h>
#include <stdlib.h>

#ifndef VKS_SUITE
#error "build with -DVKS_SUITE=<name>_suite"
#endif

Suite *VKS_SUITE(void);

int main(void)
{
    SRunner *sr = srunner_create(VKS_SUITE());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
