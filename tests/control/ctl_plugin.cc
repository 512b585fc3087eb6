static int g_init = 0;
__attribute__((constructor)) static void plugin_ctor() { g_init = 1; }
extern "C" int ctl_plugin_twice(int x) { return g_init * 2 * x; }
