/* A closed-loop gRPC load generator for one HTTP/2 connection, in C: the lean client of
 * bench/load/clients.py's LeanLoad, which runs one process per connection as h2load does, so
 * that the server's figures do not depend on the client's own cost (a Python client's share
 * of the caches and its wake-ups lower a slower server's figure more than a faster one's).
 *
 * leanload HOST PORT FRAMES FIRST_BLOCK LATER_BLOCK STREAMS SETTLE_S DURATION_S FIRST STRIDE
 *          LATENCIES
 *
 * Sends body FIRST + j * STRIDE (mod their count) of FRAMES (back-to-back gRPC frames) on
 * stream 2j + 1, each as HEADERS (FIRST_BLOCK's header block for the first request, which
 * fills the server's dynamic table, LATER_BLOCK's after) and one DATA, with at most STREAMS in
 * flight. It asks the server for no dynamic table, so every answer's trailers are one
 * self-contained block: it counts each distinct block's answers inside the window and prints
 * them (hex) for the caller to decode. An answer whose DATA does not start with overall_code OK
 * is an error. Prints one JSON line; writes the latencies (float64 ms) inside the window to
 * LATENCIES. Every wait is bounded: the run ends DRAIN_S after the window at the latest. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_STREAMS 1024
#define MAX_BLOCKS 8 /* distinct trailer blocks kept; answers with others are errors */
#define MAX_BLOCK 256
#define DRAIN_S 2.0
#define MAX_REQUESTS 20000000L
#define WINDOW 0x7fffffffL /* ours: the server never waits for us */
enum { DATA = 0, HEADERS = 1, RST_STREAM = 3, SETTINGS = 4, PING = 6, GOAWAY = 7, WINDOW_UPDATE = 8 };
enum { END_STREAM = 1, ACK = 1, END_HEADERS = 4 };

typedef struct { unsigned char *bytes; size_t size; } Bytes;
typedef struct { unsigned char bytes[MAX_BLOCK]; size_t size; long answers; } Block;

static Bytes *bodies, header_block[2];
static size_t body_count;
static long first, stride, sent, limit, window = 65535, flight_count;
static uint32_t flight_sid[MAX_STREAMS];
static double flight_at[MAX_STREAMS], start, end;
static double *latencies;
static size_t latency_count, latency_room;
static Block blocks[MAX_BLOCKS];
static int block_count, open_ = 1;
static long errors;
static char first_error[160];
static unsigned char *out;
static size_t out_size, out_room;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fail(long count, const char *why) {
    errors += count;
    if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s", why);
}

static void *grown(void *at, size_t *room, size_t need, size_t item) {
    if (need <= *room) return at;
    *room = 2 * need;
    if (!(at = realloc(at, *room * item))) exit(3);
    return at;
}

static void put(const void *bytes, size_t size) {
    out = grown(out, &out_room, out_size + size, 1);
    memcpy(out + out_size, bytes, size);
    out_size += size;
}

static void frame_head(size_t size, int kind, int flags, uint32_t sid) {
    unsigned char h[9] = {size >> 16, size >> 8, size, kind, flags, sid >> 24, sid >> 16, sid >> 8, sid};
    put(h, 9);
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

static Bytes read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    Bytes b = {0, 0};
    if (!f || fseek(f, 0, SEEK_END) || (long)(b.size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) exit(2);
    if (!(b.bytes = malloc(b.size + 1)) || fread(b.bytes, 1, b.size, f) != b.size) exit(2);
    fclose(f);
    return b;
}

static void split_frames(Bytes all) {
    for (size_t at = 0; at + 5 <= all.size; body_count++) at += 5 + be32(all.bytes + at + 1);
    bodies = calloc(body_count, sizeof *bodies);
    for (size_t at = 0, i = 0; i < body_count; i++) {
        bodies[i] = (Bytes){all.bytes + at, 5 + be32(all.bytes + at + 1)};
        at += bodies[i].size;
    }
}

static void fill(double now) { /* as many requests as free streams and the window allow */
    while (open_ && flight_count < limit && sent < MAX_REQUESTS / stride) {
        Bytes body = bodies[(first + sent * stride) % body_count], block = header_block[sent > 0];
        uint32_t sid = 2 * sent + 1;
        if ((long)body.size > window) return;
        frame_head(block.size, HEADERS, END_HEADERS, sid);
        put(block.bytes, block.size);
        frame_head(body.size, DATA, END_STREAM, sid);
        put(body.bytes, body.size);
        window -= body.size;
        flight_sid[flight_count] = sid, flight_at[flight_count++] = now;
        sent++;
    }
}

static int flush(int fd) {
    for (size_t at = 0; at < out_size;) {
        ssize_t n = send(fd, out + at, out_size - at, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail(1, "connection failed on send"), open_ = 0, -1;
        at += n;
    }
    out_size = 0;
    return 0;
}

static double landed(uint32_t sid) { /* the stream's send time, no longer in flight; 0: none */
    for (long i = 0; i < flight_count; i++) {
        if (flight_sid[i] != sid) continue;
        double at = flight_at[i];
        flight_sid[i] = flight_sid[--flight_count], flight_at[i] = flight_at[flight_count];
        return at;
    }
    return 0;
}

static void trailers(const unsigned char *p, size_t size, uint32_t sid, double now) {
    double sent_at = landed(sid);
    int in_window = start <= now && now <= end, i = 0;
    if (!sent_at || !in_window) return;
    while (i < block_count && (blocks[i].size != size || memcmp(blocks[i].bytes, p, size))) i++;
    if (i == block_count && (i == MAX_BLOCKS || size > MAX_BLOCK)) {
        fail(1, "too many kinds of trailers");
        return;
    }
    if (i == block_count) memcpy(blocks[i].bytes, p, blocks[i].size = size), block_count++;
    blocks[i].answers++;
    latencies = grown(latencies, &latency_room, latency_count + 1, sizeof *latencies);
    latencies[latency_count++] = (now - sent_at) * 1000;
}

static void control(int kind, int flags, uint32_t sid, const unsigned char *p, size_t size) {
    if (kind == SETTINGS && !(flags & ACK)) {
        for (size_t i = 0; i + 6 <= size; i += 6)
            if ((p[i] << 8 | p[i + 1]) == 3 && be32(p + i + 2) < (uint32_t)limit) limit = be32(p + i + 2);
        frame_head(0, SETTINGS, ACK, 0);
    } else if (kind == PING && !(flags & ACK) && size == 8) {
        frame_head(8, PING, ACK, 0), put(p, 8);
    } else if (kind == WINDOW_UPDATE && sid == 0 && size == 4) {
        window += be32(p) & 0x7fffffff;
    } else if (kind == RST_STREAM && landed(sid)) {
        fail(1, "stream reset");
    } else if (kind == GOAWAY) {
        fail(flight_count ? flight_count : 1, "GOAWAY"), flight_count = 0, open_ = 0;
    }
}

static size_t parse(const unsigned char *b, size_t size, double now) { /* where the rest begins */
    size_t at = 0;
    while (size - at >= 9) {
        size_t length = b[at] << 16 | b[at + 1] << 8 | b[at + 2];
        int kind = b[at + 3], flags = b[at + 4];
        uint32_t sid = be32(b + at + 5) & 0x7fffffff;
        const unsigned char *p = b + at + 9;
        if (at + 9 + length > size) break;
        if (kind == HEADERS && flags & END_STREAM) trailers(p, length, sid, now);
        else if (kind == DATA && (length < 7 || p[5] != 0x08 || p[6] != 0x01) && landed(sid))
            fail(1, "overall_code not OK");
        else if (kind != DATA && kind != HEADERS) control(kind, flags, sid, p, length);
        at += 9 + length;
    }
    return at;
}

static int connect_to(const char *host, const char *port) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *found;
    int fd = -1, one = 1;
    if (getaddrinfo(host, port, &hints, &found)) return -1;
    for (struct addrinfo *a = found; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) close(fd), fd = -1;
    }
    freeaddrinfo(found);
    if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void hello(void) { /* preface, SETTINGS (no dynamic table, our window), WINDOW_UPDATE */
    static const unsigned char settings[12] = {0, 1, 0, 0, 0, 0, 0, 4, 0x7f, 0xff, 0xff, 0xff};
    uint32_t more = WINDOW - 65535;
    unsigned char update[4] = {more >> 24, more >> 16, more >> 8, more};
    put("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
    frame_head(sizeof settings, SETTINGS, 0, 0), put(settings, sizeof settings);
    frame_head(4, WINDOW_UPDATE, 0, 0), put(update, 4);
}

static void serve(int fd) { /* until the window ends, then the answers due, DRAIN_S at most */
    size_t room = 1 << 18, used = 0;
    unsigned char *in = malloc(room);
    int epoll = epoll_create1(0);
    struct epoll_event ready = {.events = EPOLLIN};
    epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ready);
    for (double now = now_s(); now < end || (now < end + DRAIN_S && flight_count && open_);) {
        int events = epoll_wait(epoll, &ready, 1, 10);
        now = now_s();
        if (events <= 0) continue;
        in = grown(in, &room, used + 1, 1);
        ssize_t got = recv(fd, in + used, room - used, 0);
        if (got <= 0) {
            fail(flight_count ? flight_count : 1, "connection closed");
            return;
        }
        size_t done = parse(in, used += got, now);
        memmove(in, in + done, used -= done);
        if (now < end) fill(now);
        if (flush(fd)) return;
    }
}

int main(int argc, char **argv) {
    if (argc != 12) return fprintf(stderr, "usage: see bench/leanload.c\n"), 2;
    split_frames(read_file(argv[3]));
    header_block[0] = read_file(argv[4]), header_block[1] = read_file(argv[5]);
    limit = atol(argv[6]), first = atol(argv[9]), stride = atol(argv[10]);
    if (!body_count || limit < 1 || limit > MAX_STREAMS || stride < 1) return fprintf(stderr, "bad arguments\n"), 2;
    int fd = connect_to(argv[1], argv[2]);
    if (fd < 0) return fprintf(stderr, "cannot connect to %s:%s: %s\n", argv[1], argv[2], strerror(errno)), 1;
    start = now_s() + atof(argv[7]), end = start + atof(argv[8]);
    hello();
    fill(now_s());
    if (!flush(fd)) serve(fd);
    close(fd);
    FILE *f = fopen(argv[11], "wb");
    if (!f || fwrite(latencies, sizeof *latencies, latency_count, f) != latency_count) return 2;
    fclose(f);
    printf("{\"sent\": %ld, \"errors\": %ld, \"first_error\": \"%s\", \"trailers\": [", sent, errors, first_error);
    for (int i = 0; i < block_count; i++) {
        printf("%s[\"", i ? ", " : "");
        for (size_t j = 0; j < blocks[i].size; j++) printf("%02x", blocks[i].bytes[j]);
        printf("\", %ld]", blocks[i].answers);
    }
    printf("]}\n");
    return 0;
}
