/*
 * tools/common/httpd.h: the tools' small HTTP/1.1 server of GET /metrics (kvvm-stress
 * --metrics-port, kvvmd --metrics).
 *
 * Contract: one thread of its own serves every connection with non-blocking sockets and
 * poll(), so a slow or hostile client never stalls the caller's threads: a request is at
 * most TOOL_HTTPD_MAX_REQUEST bytes of header (else 431), each connection has
 * TOOL_HTTPD_TIMEOUT_MS from accept to its last byte written (then it is closed), and at
 * most TOOL_HTTPD_MAX_CONNS are open (a new one past that closes the oldest still
 * reading). GET (and HEAD) of /metrics (a query string ignored) answers 200 with the body
 * fn gives, as text/plain; version=0.0.4 (Prometheus's text format); another path 404,
 * another method 405, a malformed request 400; every answer closes the connection
 * (Connection: close). fn runs on the server's thread, one call at a time. The thread
 * blocks every signal (they go to the process's other threads).
 */
#ifndef KVVM_TOOLS_HTTPD_H
#define KVVM_TOOLS_HTTPD_H

#include <stddef.h>
#include <stdint.h>

#define TOOL_HTTPD_MAX_REQUEST 8192
#define TOOL_HTTPD_TIMEOUT_MS  10000
#define TOOL_HTTPD_MAX_CONNS   16

/* The body of a 200 answer: a malloc'ed buffer of *len bytes (the server frees it), or
   NULL for a 500 answer. */
typedef char *(*tool_httpd_body_fn)(void *arg, size_t *len);

struct tool_httpd;

/* Listens on addr (an IPv4 address, e.g. "127.0.0.1") and port (0: a free one, see
   tool_httpd_port) and starts the thread. 0, or -errno with the reason in err. */
int tool_httpd_start(const char *addr, uint16_t port, tool_httpd_body_fn fn, void *arg,
                     struct tool_httpd **out, char *err, size_t errlen);
/* The port it listens on. */
uint16_t tool_httpd_port(const struct tool_httpd *h);
/* Answers given so far: 200s, and the others (errors, timeouts, evictions). */
void tool_httpd_counts(const struct tool_httpd *h, uint64_t *ok, uint64_t *refused);
/* Stops and joins the thread, closes every connection, frees h. NULL: nothing. */
void tool_httpd_stop(struct tool_httpd *h);

#endif
