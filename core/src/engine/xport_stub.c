/* xport_stub: the stubs a module names for the slots it has nothing for, and the
 * check that a module's table has every slot filled (xport.h). */
#include <errno.h>
#include <stdio.h>

#include "engine/xport_link.h"
#include "util/status_int.h"

HixlStatus xport_no_open(struct HixlEngine *e) {
  (void)e;
  return HIXL_SUCCESS;
}
void xport_no_engine(struct HixlEngine *e) { (void)e; }
uint32_t xport_no_caps(const struct HixlEngine *e) {
  (void)e;
  return 0;
}
int xport_no_event_fd(const struct HixlEngine *e) {
  (void)e;
  return -1;
}
bool xport_no_progress(struct HixlEngine *e) {
  (void)e;
  return false;
}
HixlStatus xport_no_reg(struct HixlEngine *e, struct hixl_mem_reg *r) {
  (void)e, (void)r;
  return HIXL_SUCCESS;
}
void xport_no_mem(struct HixlEngine *e, struct hixl_mem_reg *r) { (void)e, (void)r; }
uint32_t xport_no_key(const struct conn *c, const struct hixl_mem_reg *r) {
  (void)c;
  (void)r;
  return 0;
}
void xport_no_unshare(struct HixlEngine *e, struct hixl_mem_reg *r, uint64_t deadline) {
  (void)e, (void)r, (void)deadline;
}
void xport_no_peer_drop(struct HixlEngine *e, const char *remote_name, uint64_t deadline) {
  (void)e, (void)remote_name, (void)deadline;
}
void *xport_no_bounce_reg(struct HixlEngine *e, void *addr, size_t len, char *err, size_t errlen) {
  (void)e, (void)addr, (void)len;
  if (errlen) err[0] = '\0';
  return NULL;
}
void xport_no_bounce_dereg(void *h) { (void)h; }
uint32_t xport_no_bounce_key(const struct conn *c, const void *h) {
  (void)c;
  (void)h;
  return 0;
}
HixlStatus xport_no_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote,
                            struct peer *p, bool *taken, void **link) {
  (void)e, (void)fd, (void)deadline, (void)remote, (void)p;
  *taken = false;
  *link = NULL;
  return HIXL_SUCCESS;
}
void xport_no_attach(struct conn *c, void *link) { (void)c, (void)link; }
void xport_no_discard(void *link) { (void)link; }
void xport_no_frame(struct conn *c, const struct wire_msg *m) {
  (void)m;
  link_conn_kill(c, HIXL_FAILED, "protocol error: a frame its module does not serve");
}
void xport_no_link(struct conn *c) { (void)c; }
void xport_no_kill(struct conn *c, HixlStatus st, const char *why) { (void)c, (void)st, (void)why; }
HixlStatus xport_no_info(const struct conn *c, struct hixl_link_info *info) {
  (void)c, (void)info;
  return HIXL_SUCCESS;
}
void xport_no_grant(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                    enum xport_grant how) {
  (void)e, (void)peer, (void)ranges, (void)n, (void)how;
}

bool xport_reach_all(const struct conn *c, const struct remote_mem *rm, uint64_t raddr, uint64_t len) {
  (void)c, (void)rm, (void)raddr, (void)len;
  return true;
}

bool xport_no_table_current(struct conn *c) {
  (void)c;
  return false;
}
void xport_no_post(struct conn *c, struct chunk *ch) {
  (void)c;
  link_chunk_end(ch, HIXL_UNSUPPORTED, "this module moves no chunks");
}
void xport_no_req(struct conn *c, struct hixl_transfer_req *r) { (void)c, (void)r; }
bool xport_no_req_timeout(struct HixlEngine *e, struct hixl_transfer_req *r) {
  (void)e, (void)r;
  return false;
}
bool xport_no_answer(struct conn *c, struct chunk *ch, const struct wire_msg *m) {
  (void)c, (void)ch, (void)m;
  return false;
}
void xport_no_chunk_end(struct chunk *ch) { (void)ch; }
int xport_no_post_own(struct conn *c, bool write, void *buf, uint32_t len, void *h, uint64_t raddr,
                      uint32_t rkey, void (*done)(struct conn *c, bool ok, const char *status)) {
  (void)c, (void)write, (void)buf, (void)len, (void)h, (void)raddr, (void)rkey, (void)done;
  errno = ENOSYS;
  return -1;
}

bool xport_no_dev_reach(struct conn *c, const struct hixl_mem_reg *lreg, const struct remote_mem *rm,
                        uint64_t raddr, uint64_t len) {
  (void)c, (void)lreg, (void)rm, (void)raddr, (void)len;
  return false;
}

bool xport_no_copy_now(struct conn *c, HixlTransferOp op, const HixlTransferOpDesc *descs, size_t n,
                       struct hixl_mem_reg *const *lregs, HixlStatus *st, char *why, size_t cap) {
  (void)c, (void)op, (void)descs, (void)n, (void)lregs, (void)st, (void)why, (void)cap;
  return false;
}

void xport_no_mem_added(struct conn *c, uint64_t addr, uint64_t len) { (void)c, (void)addr, (void)len; }

int xport_no_post_tag(struct conn *c, struct hixl_transfer_req *r, uint32_t tag) {
  (void)c, (void)r, (void)tag;
  return -1;
}

HixlStatus xport_check(const struct xport_ops *x) {
  if (!x || !x->name) return hixl_fail(HIXL_PARAM_INVALID, "a module's table is NULL or has no name");
#define CHECK_SLOT(slot)                                                                                     \
  if (!x->slot)                                                                                              \
    return hixl_fail(HIXL_PARAM_INVALID, "module %s leaves its slot %s empty (name an xport_no_* stub)",     \
                     x->name, #slot);
  XPORT_SLOTS(CHECK_SLOT)
#undef CHECK_SLOT
  return HIXL_SUCCESS;
}
