"""The test world's own tests (the package rocmtrain_testworld, tests/testworld)."""
