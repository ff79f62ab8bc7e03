// Each fallback and custom operator a delegate's .so calls is an event of the execute's
// event tracer (metal_backend.cpp keeps the tracer of the execute in progress). The
// trampoline's native paths open one of these for the length of the shim call; with no
// tracer it costs one call and a branch.
#ifndef ETMETAL_STOCK_EVENTS_H
#define ETMETAL_STOCK_EVENTS_H

#ifdef __cplusplus
extern "C" {
#endif
// 1 when an event was started (a tracer is set), 0 otherwise; end takes what begin returned
int etm_stock_event_begin(const char* name);
void etm_stock_event_end(int began);
#ifdef __cplusplus
}  // extern "C"

struct EtmFallbackEvent {
  explicit EtmFallbackEvent(const char* name) : began(etm_stock_event_begin(name)) {}
  ~EtmFallbackEvent() { etm_stock_event_end(began); }
  EtmFallbackEvent(const EtmFallbackEvent&) = delete;
  EtmFallbackEvent& operator=(const EtmFallbackEvent&) = delete;
  int began;
};
#endif

#endif  // ETMETAL_STOCK_EVENTS_H
