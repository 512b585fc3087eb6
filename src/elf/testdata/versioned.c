// Fixture with two versions of one symbol: remora_vfunc@REMORA_V1 (hidden,
// old) and remora_vfunc@@REMORA_V2 (the default, which dlsym returns).
__attribute__((used)) int remora_vfunc_v1(void) { return 1; }
__attribute__((used)) int remora_vfunc_v2(void) { return 2; }
__asm__(".symver remora_vfunc_v1, remora_vfunc@REMORA_V1");
__asm__(".symver remora_vfunc_v2, remora_vfunc@@REMORA_V2");
int remora_vother(void) { return 3; }

// Hidden but versioned: .symtab alone holds "remora_hfunc@@REMORA_V2".
__attribute__((visibility("hidden"), used)) int remora_hfunc_impl(void) { return 4; }
__asm__(".symver remora_hfunc_impl, remora_hfunc@@REMORA_V2");
