# The CTest selection run-gpu-checks.sh runs on a GPU machine and pack.sh packs for it
# (sourced by both): the GPU suite, the provider's tests, the CS API's and the cache
# manager's argument tests, the mock host's device hand-offs; not the RDMA ones, nor
# those on the fake CUDA driver of the test builds (fakecuda_*).
GPU_TESTS_R='gpu_check|test_devmem|mock_host_cuda|mock_host_devmem|^test_cs$|^test_cache$|^test_engine_args$'
GPU_TESTS_E='rdma|fakecuda'
