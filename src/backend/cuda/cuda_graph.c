/*
 * cuda_graph.c - recording op records and replaying them as CUDA graphs.
 *
 * Ops are recorded (cuda_record) and flushed at the next download, sync,
 * upload, alloc or free.  A decode-sized burst (at least GRAPH_MIN_OPS ops,
 * none over GRAPH_MAX_ROWS token rows) replays the graph captured for the
 * same op sequence, found by comparing the records byte for byte, or
 * captures one into the least recently used of GRAPH_SLOTS slots; any other
 * burst launches its ops one by one.  Positions and tokens live in device
 * memory, so consecutive decode steps record identical sequences.  Either
 * way the burst goes through cuda_exec_ops, which fuses neighbouring ops
 * (cuda_fuse.c).
 *
 * A captured graph holds the pointers of the scratch buffers its ops used:
 * growing a scratch buffer drops every graph (cuda_drop_graphs).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_host.h"

void cuda_record(cuda_backend *cb, const pt_op *o, int rows) {
    if (cb->n_list == cb->list_cap) {
        cb->list_cap = cb->list_cap ? 2 * cb->list_cap : 256;
        cb->list = pt_xrealloc(cb->list, sizeof(pt_op) * (size_t)cb->list_cap);
    }
    memcpy(&cb->list[cb->n_list++], o, sizeof *o); /* padding bytes too: see cuda_host.h */
    if (rows > cb->list_rows) cb->list_rows = rows;
}

void cuda_drop_graphs(cuda_backend *cb) {
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        graph_slot *g = &cb->graphs[i];
        if (g->exec) cudaGraphExecDestroy(g->exec);
        free(g->recs);
        memset(g, 0, sizeof *g);
    }
}

/* Captures the recorded ops into a graph in the least recently used slot
 * (updating its executable in place when the shape allows).  NULL if
 * capture failed: graphs are then turned off for good. */
static graph_slot *capture(cuda_backend *cb) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamBeginCapture(cb->ctx.s, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        cuda_exec_ops(cb, cb->list, cb->n_list, false);
        e = cudaStreamEndCapture(cb->ctx.s, &graph);
    }
    if (e != cudaSuccess || !graph) {
        cudaGetLastError();
        pt_warn("cuda: graph capture failed (%s); running ops one by one from now on",
                cudaGetErrorString(e));
        cb->use_graphs = false;
        return NULL;
    }
    graph_slot *g = &cb->graphs[0];
    for (int i = 1; i < GRAPH_SLOTS; i++)
        if (cb->graphs[i].last_use < g->last_use) g = &cb->graphs[i];
    cudaGraphExecUpdateResultInfo info;
    if (!g->exec || cudaGraphExecUpdate(g->exec, graph, &info) != cudaSuccess) {
        cudaGetLastError();
        if (g->exec) cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            cudaGraphDestroy(graph);
            pt_warn("cuda: graph instantiation failed (%s); running ops one by one from now on",
                    cudaGetErrorString(e));
            g->exec = NULL;
            cb->use_graphs = false;
            return NULL;
        }
    }
    if (cudaGraphGetNodes(graph, NULL, &cb->graph_nodes) != cudaSuccess) cudaGetLastError();
    cudaGraphDestroy(graph);
    g->recs = pt_xrealloc(g->recs, sizeof(pt_op) * (size_t)cb->n_list);
    memcpy(g->recs, cb->list, sizeof(pt_op) * (size_t)cb->n_list);
    g->n = cb->n_list;
    cb->n_captures++;
    return g;
}

/* Runs what was recorded: a decode-sized step replays the graph captured
 * for the same op sequence, or captures one; anything else runs directly.
 * In the error state the records are dropped: their inputs are garbage. */
void cuda_flush(cuda_backend *cb) {
    if (!cb->n_list) return;
    graph_slot *g = NULL;
    if (!cb->base.failed && cb->use_graphs && cb->n_list >= GRAPH_MIN_OPS &&
        cb->list_rows <= GRAPH_MAX_ROWS) {
        for (int i = 0; i < GRAPH_SLOTS && !g; i++)
            if (cb->graphs[i].exec && cb->graphs[i].n == cb->n_list &&
                memcmp(cb->graphs[i].recs, cb->list, sizeof(pt_op) * (size_t)cb->n_list) == 0)
                g = &cb->graphs[i];
        if (g) cb->n_replays++;
        else g = capture(cb);
        if (g && cb->base.failed) { /* an op failed while captured: the graph lacks it */
            cuda_drop_graphs(cb);
            g = NULL;
        }
    }
    if (g) {
        g->last_use = ++cb->clock;
        cuda_ok(cb, cudaGraphLaunch(g->exec, cb->ctx.s), "graph launch");
    } else {
        cuda_exec_ops(cb, cb->list, cb->n_list, true);
    }
    cb->n_list = 0;
    cb->list_rows = 0;
}
