// data_describe.c — data_describe: the one log line that says what a data set holds (format,
// files, records, tokens and windows per split; a mixture source by source).
#include <stdio.h>
#include <string.h>

#include "data_impl.h"

static void human(uint64_t v, char* b, size_t n) {
    if (v >= 1000000000ull) snprintf(b, n, "%.2fG", (double)v / 1e9);
    else if (v >= 1000000ull) snprintf(b, n, "%.2fM", (double)v / 1e6);
    else if (v >= 10000ull) snprintf(b, n, "%.1fK", (double)v / 1e3);
    else snprintf(b, n, "%llu", (unsigned long long)v);
}

static void describe_plain(const DataSet* ds, char* buf, size_t n, int as_val);

void data_describe(const DataSet* ds, char* buf, size_t n) {
    if (ds->kind == KIND_MIX) {
        size_t o = 0;
        buf[0] = 0;
        for (int d = 0; d < ds->ncomp && o + 1 < n; d++) {
            if (ds->weight) o += (size_t)snprintf(buf + o, n - o, "%ssource %d (weight %.3g): ", d ? "; " : "", d + 1,
                                                  ds->weight[d]);
            if (o + 1 < n) data_describe(ds->comp[d], buf + o, n - o);
            o += strlen(buf + o);
        }
        if (ds->val && o + 1 < n) {
            o += (size_t)snprintf(buf + o, n - o, "; validation data: ");
            if (o + 1 < n) describe_plain(ds->val, buf + o, n - o, 1);
        }
        return;
    }
    if (ds->kind == KIND_RANDOM) {
        snprintf(buf, n, "random tokens in [0, %d) from seed %llu: unlimited train windows, %llu validation "
                 "(seq_len %d)", ds->vocab, (unsigned long long)ds->seed, (unsigned long long)ds->st[1].nwin,
                 ds->seq_len);
        return;
    }
    describe_plain(ds, buf, n, 0);
}

// One source (not a mix): its files, tokens and windows; as_val: data.val_path's data, all of
// which is validation (its split 0), said so.
static void describe_plain(const DataSet* ds, char* buf, size_t n, int as_val) {
    char fmt[64] = "";
    for (int f = DATA_FASTA; f <= DATA_BIN; f++)
        if (ds->fmt_mask & (1u << f))
            snprintf(fmt + strlen(fmt), sizeof fmt - strlen(fmt), "%s%s", fmt[0] ? "+" : "", data_fmt_name(f));
    if (ds->kind == KIND_BIN)
        snprintf(fmt + strlen(fmt), sizeof fmt - strlen(fmt), " %s",
                 ds->width_mask == (1u << 2) ? "uint16" : ds->width_mask == (1u << 4) ? "uint32" : "uint16+uint32");
    char files[300], recs[128] = "", t0[32], t1[32];
    if (ds->nfiles > 1) snprintf(files, sizeof files, "%s and %d more", ds->first, ds->nfiles - 1);
    else snprintf(files, sizeof files, "%s", ds->first);
    if (ds->kind == KIND_BYTES) {
        if (ds->single)
            snprintf(recs, sizeof recs, "1 record split by position; ");
        else
            snprintf(recs, sizeof recs, "%llu records (%llu train, %llu validation); ",
                     (unsigned long long)ds->corpus.nrec, (unsigned long long)ds->st[0].records,
                     (unsigned long long)ds->st[1].records);
    }
    human(ds->st[0].ntok, t0, sizeof t0);
    human(ds->st[1].ntok, t1, sizeof t1);
    if (as_val) {
        recs[0] = 0;
        if (ds->kind == KIND_BYTES && !ds->single)
            snprintf(recs, sizeof recs, "%llu records; ", (unsigned long long)ds->corpus.nrec);
        snprintf(buf, n, "%s%s, %s: %stokens %s; windows %llu (seq_len %d, stride %d, in order)", fmt,
                 ds->any_gz ? " (gzip)" : "", files, recs, t0, (unsigned long long)ds->st[0].nwin, ds->seq_len,
                 ds->seq_len);
        return;
    }
    if (!ds->st[1].ntok && !ds->st[1].nwin) {  // no split (val_frac 0, or separate validation data)
        snprintf(buf, n, "%s%s, %s: %stokens %s train; windows %llu train (seq_len %d, stride %d, shuffle %s)", fmt,
                 ds->any_gz ? " (gzip)" : "", files, recs, t0, (unsigned long long)ds->st[0].nwin, ds->seq_len,
                 ds->seq_len, ds->shuffle ? "on" : "off");
        return;
    }
    snprintf(buf, n, "%s%s, %s: %stokens %s train, %s validation; windows %llu train, %llu validation "
             "(seq_len %d, stride %d, shuffle %s)", fmt, ds->any_gz ? " (gzip)" : "", files, recs, t0, t1,
             (unsigned long long)ds->st[0].nwin, (unsigned long long)ds->st[1].nwin, ds->seq_len, ds->seq_len,
             ds->shuffle ? "on" : "off");
}
