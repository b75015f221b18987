/*
 * The plot of a run: metrics.jsonl → an SVG of three panels over the optimizer steps — the MLM loss
 * (each step, its moving average, the held-out evaluations), the MLM accuracy (moving average and
 * held-out) and the learning rate. Plain SVG 1.1 written by hand; any browser shows it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "pretrain_data.h"
#include "train.h"

dstp_status dstp_read_file(const char *path, char **data, size_t *len, dstp_error *err);

typedef struct series {
    double *x, *y;
    size_t n, cap;
} series;

static int push(series *s, double x, double y) {
    if (s->n == s->cap) {
        const size_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = (double *)realloc(s->x, cap * sizeof *nx), *ny;
        if (!nx) return 0;
        s->x = nx;
        ny = (double *)realloc(s->y, cap * sizeof *ny);
        if (!ny) return 0;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    ++s->n;
    return 1;
}

static void series_free(series *s) {
    free(s->x);
    free(s->y);
}

/* The centred moving average of y over `w` points on each side. */
static int smooth(const series *in, size_t w, series *out) {
    size_t i;
    double sum = 0.0;
    size_t lo = 0, hi = 0; /* window [lo, hi) */
    for (i = 0; i < in->n; ++i) {
        const size_t want_lo = i > w ? i - w : 0, want_hi = i + w + 1 < in->n ? i + w + 1 : in->n;
        while (hi < want_hi) sum += in->y[hi++];
        while (lo < want_lo) sum -= in->y[lo++];
        if (!push(out, in->x[i], sum / (double)(hi - lo))) return 0;
    }
    return 1;
}

/* A "nice" tick spacing (1, 2 or 5 × 10^k) for about `n` ticks over [lo, hi]. */
static double tick_step(double lo, double hi, int n) {
    const double raw = (hi - lo) / (double)n, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * p;
}

typedef struct panel {
    double left, top, width, height;
    double x0, x1, y0, y1;
} panel;

static double px(const panel *p, double x) { return p->left + (x - p->x0) / (p->x1 - p->x0) * p->width; }
static double py(const panel *p, double y) { return p->top + p->height - (y - p->y0) / (p->y1 - p->y0) * p->height; }

static void range_of(const series *const *s, int count, double *lo, double *hi) {
    int k;
    size_t i;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (k = 0; k < count; ++k)
        for (i = 0; i < s[k]->n; ++i) {
            if (s[k]->y[i] < *lo) *lo = s[k]->y[i];
            if (s[k]->y[i] > *hi) *hi = s[k]->y[i];
        }
    if (!(*lo <= *hi)) *lo = 0.0, *hi = 1.0;
    if (*hi - *lo < 1e-12 * (fabs(*hi) + 1e-30)) {
        const double d = fabs(*hi) > 0 ? 0.1 * fabs(*hi) : 1.0;
        *lo -= d;
        *hi += d;
    }
}

static void frame(FILE *f, panel *p, const char *title, int percent) {
    double t, st;
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fafafa\" stroke=\"#999\"/>\n", p->left,
            p->top, p->width, p->height);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">%s</text>\n", p->left, p->top - 8, title);
    st = tick_step(p->y0, p->y1, 5);
    for (t = ceil(p->y0 / st) * st; t <= p->y1 + 1e-9 * st; t += st) {
        const double y = py(p, t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", p->left, y,
                p->left + p->width, y);
        if (percent) fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f%%</text>\n", p->left - 6, y + 4, 100 * t);
        else fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", p->left - 6, y + 4, t);
    }
    st = tick_step(p->x0, p->x1, 8);
    if (st < 1) st = 1;
    for (t = ceil(p->x0 / st) * st; t <= p->x1 + 1e-9 * st; t += st) {
        const double x = px(p, t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", x, p->top, x,
                p->top + p->height);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x, p->top + p->height + 16, t);
    }
}

static void polyline(FILE *f, const panel *p, const series *s, const char *color, double width, double opacity) {
    size_t i, step = s->n > 2000 ? s->n / 2000 : 1;
    if (s->n == 0) return;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" stroke-opacity=\"%.2f\" points=\"", color, width,
            opacity);
    for (i = 0; i < s->n; i += step) fprintf(f, "%.1f,%.1f ", px(p, s->x[i]), py(p, s->y[i]));
    if ((s->n - 1) % step) fprintf(f, "%.1f,%.1f", px(p, s->x[s->n - 1]), py(p, s->y[s->n - 1]));
    fprintf(f, "\"/>\n");
}

static void dots(FILE *f, const panel *p, const series *s, const char *color) {
    size_t i;
    polyline(f, p, s, color, 1.5, 0.9);
    for (i = 0; i < s->n; ++i)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(p, s->x[i]), py(p, s->y[i]), color);
}

static void legend(FILE *f, const panel *p, int row, const char *color, const char *text) {
    const double x = p->left + p->width - 190, y = p->top + 16 + 16 * row;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"/>\n", x, y - 4,
            x + 22, y - 4, color);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 28, y, text);
}

int dstp_plot(const char *metrics, const char *svg, char *errbuf, size_t err_size) {
    char *text = NULL, *line, *save = NULL;
    size_t len = 0, w;
    dstp_error err;
    series loss = {0}, lr = {0}, eloss = {0}, eacc = {0}, sloss = {0}, sacc = {0}, raw_acc = {0};
    FILE *f;
    int rc = -1;
    double x0, x1;
    panel p[3];
    int k;
    if (dstp_read_file(metrics, &text, &len, &err) != DSTP_OK) {
        snprintf(errbuf, err_size, "%s", err.msg);
        return -1;
    }
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_error_t jerr;
        json_t *v = json_loads(line, 0, &jerr);
        const json_t *t = json_object_get(v, "type"), *s = json_object_get(v, "step");
        if (json_is_string(t) && json_is_number(s)) {
            const json_t *ml = json_object_get(v, "mlm_loss"), *ma = json_object_get(v, "mlm_acc"), *l = json_object_get(v, "lr");
            const double x = json_number_value(s);
            if (strcmp(json_string_value(t), "train") == 0 && json_is_number(ml) && json_is_number(ma) && json_is_number(l)) {
                push(&loss, x, json_number_value(ml));
                push(&raw_acc, x, json_number_value(ma));
                push(&lr, x, json_number_value(l));
            } else if (strcmp(json_string_value(t), "eval") == 0 && json_is_number(ml) && json_is_number(ma)) {
                push(&eloss, x, json_number_value(ml));
                push(&eacc, x, json_number_value(ma));
            }
        }
        json_decref(v);
    }
    free(text);
    w = loss.n / 60 + 1;
    smooth(&loss, w, &sloss);
    smooth(&raw_acc, w, &sacc);
    f = fopen(svg, "wb");
    if (!f) {
        snprintf(errbuf, err_size, "%s: cannot write", svg);
        goto out;
    }
    x0 = loss.n ? loss.x[0] - 1 : 0;
    x1 = loss.n ? loss.x[loss.n - 1] : 1;
    if (eloss.n && eloss.x[eloss.n - 1] > x1) x1 = eloss.x[eloss.n - 1];
    if (x1 <= x0) x1 = x0 + 1;
    for (k = 0; k < 3; ++k) {
        p[k].left = 80;
        p[k].top = 50 + 250 * k;
        p[k].width = 780;
        p[k].height = 190;
        p[k].x0 = x0;
        p[k].x1 = x1;
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"800\" viewBox=\"0 0 900 800\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect width=\"900\" height=\"800\" fill=\"white\"/>\n"
               "<text x=\"80\" y=\"22\" font-size=\"15\" font-weight=\"bold\">dst-pretrain: %zu steps</text>\n",
            loss.n);
    {
        const series *ls[] = {&loss, &eloss};
        range_of(ls, 2, &p[0].y0, &p[0].y1);
    }
    frame(f, &p[0], "MLM loss (nats per masked token)", 0);
    polyline(f, &p[0], &loss, "#4c72b0", 1.0, 0.35);
    polyline(f, &p[0], &sloss, "#4c72b0", 2.5, 1.0);
    dots(f, &p[0], &eloss, "#dd8452");
    legend(f, &p[0], 0, "#4c72b0", "training (moving average)");
    if (eloss.n) legend(f, &p[0], 1, "#dd8452", "held-out");
    {
        const series *as[] = {&sacc, &eacc};
        range_of(as, 2, &p[1].y0, &p[1].y1);
        if (p[1].y0 > 0) p[1].y0 = 0;
    }
    frame(f, &p[1], "MLM accuracy (masked tokens predicted exactly)", 1);
    polyline(f, &p[1], &sacc, "#4c72b0", 2.5, 1.0);
    dots(f, &p[1], &eacc, "#dd8452");
    legend(f, &p[1], 0, "#4c72b0", "training (moving average)");
    if (eacc.n) legend(f, &p[1], 1, "#dd8452", "held-out");
    {
        const series *rs[] = {&lr};
        range_of(rs, 1, &p[2].y0, &p[2].y1);
        if (p[2].y0 > 0) p[2].y0 = 0;
    }
    frame(f, &p[2], "learning rate", 0);
    polyline(f, &p[2], &lr, "#55a868", 2.0, 1.0);
    fprintf(f, "<text x=\"470\" y=\"790\" text-anchor=\"middle\">optimizer step</text>\n</svg>\n");
    if (fclose(f) != 0) snprintf(errbuf, err_size, "%s: cannot write", svg);
    else rc = 0;
out:
    series_free(&loss);
    series_free(&lr);
    series_free(&eloss);
    series_free(&eacc);
    series_free(&sloss);
    series_free(&sacc);
    series_free(&raw_acc);
    return rc;
}
