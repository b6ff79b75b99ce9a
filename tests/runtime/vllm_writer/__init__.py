# The tests of tokenrouter/runtime/vllm/ (a folder named vllm here would shadow the vllm
# package: pytest puts tests/runtime on sys.path).
