// A library that exists only on the controller's side: the container test
// passes it into the target with make_visible() and a remote dlopen().
__attribute__((visibility("default"), noinline, used)) int ctr_host_value(void) { return 31337; }
