/* status.c: the front ends' status tables (kcd.h says what they are).
 * A table is published with one atomic store, so that a reader on another
 * thread sees it whole or not at all. */
#include "kcd.h"

void kcd_status_register(kcd_state *st, kcd_fe fe, const kcd_status *t) {
  atomic_store(&st->status[fe], t);
}

void kcd_status_unregister(kcd_state *st, kcd_fe fe) {
  atomic_store(&st->status[fe], NULL);
}

int kcd_status_up(kcd_state *st, kcd_fe fe) {
  return atomic_load(&st->status[fe]) != NULL;
}

void kcd_status_metrics(kcd_state *st, void *f) {
  for (int fe = 0; fe < KCD_N_FE; fe++) {
    const kcd_status *t = atomic_load(&st->status[fe]);
    if (t && t->metrics)
      t->metrics(t->self, f);
  }
}

void kcd_status_stats(kcd_state *st, void *o) {
  for (int fe = 0; fe < KCD_N_FE; fe++) {
    const kcd_status *t = atomic_load(&st->status[fe]);
    if (t && t->stats)
      t->stats(t->self, o);
  }
}

void kcd_status_history(kcd_state *st, uint64_t v[KCD_H_N]) {
  for (int fe = 0; fe < KCD_N_FE; fe++) {
    const kcd_status *t = atomic_load(&st->status[fe]);
    if (t && t->history)
      t->history(t->self, v);
  }
}
