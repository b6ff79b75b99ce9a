# Every test folder is a package (tests/test_layering.py checks it), so pytest imports a test
# as `tests.runtime.http.test_http` with the repository's root on sys.path: two folders may
# hold files of the same name, and a folder may be named like a library (`tests/runtime/vllm`)
# without hiding it.
