/* A shared object that needs a symbol only libtorch would provide: the mps_emulated
   undefined-symbol check must reject it by name. */
extern void c10_error_handler(const char* message);

void report(void) { c10_error_handler("unreachable"); }
