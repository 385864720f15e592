/* Linked with main.c into a static consumer whose own global names are ones the library's
   layers use inside (issue 24: libkvvm.a exported them, and such a program failed to link
   with "multiple definition"). It must link against libkvvm.a and run main.c's open and
   close, the library's own pool_take, seq_lookup ... running beside these. */
int pool_take(void);
int seq_lookup(void);
int page_get(void);
int json_put(void);
int config_check(void);
int vmm_open(void);
extern int emu;          /* the emulated device's state (vmm/emu/emu_int.h) */

int pool_take(void) { return 1; }
int seq_lookup(void) { return 2; }
int page_get(void) { return 3; }
int json_put(void) { return 4; }
int config_check(void) { return 5; }
int vmm_open(void) { return 6; }
int emu = 7;
