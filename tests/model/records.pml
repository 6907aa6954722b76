/*
 * A Promela model of rdmalock's request records and lockd's reaping (docs/protocol.md §9-11),
 * checked with spin (tests/model/check.sh): the part of the protocol above the lock word, where
 * issue 16's finding 3 was, and where this model found a second hole (below).
 *
 * What it models: one session with NT threads, each on its own QP, sharing the session record's
 * request entry through the SDK's entry pool. A QP is a FIFO of posted operations that land in
 * order (RC), at any moment the network chooses, interleaved with other QPs' in any way. A use of
 * the entry gets a new seq and either
 *   - is granted a shared ticket: WRITE a = (seq, ticket), then the release: WRITE d = seq, then
 *     the release CAS; the entry goes back to the pool when the release completes (RC: everything
 *     posted before it landed), or
 *   - ends without a grant (a busy try, a timeout, a lapsed lease), with its entry written (a
 *     ticket drawn, then withdrawn: its number goes to the next requester) or not (a bounce off a
 *     frozen word): the entry is cleared and goes back to the pool once the clear has landed
 *     (LockEngine::FreeRecord), or
 *   - is granted while it gives its ticket up: the entry written, the withdrawal's done mark, a
 *     CAS that misses (the ticket was granted meanwhile), then (REARM) the entry again as a new
 *     use with a seq no other use has, and the release (done mark, CAS) as above.
 * At any moment lockd may end the session: it fences every QP (nothing more lands), reads the
 * entry and, if it is live (well-formed and d != seq), releases its ticket, as its recovery does.
 *
 * Property (assertion): no ticket is released twice. A shared release carries no identity, so a
 * second release of a reader's ticket counts for another reader and admits a writer beside it.
 *
 * The two halves of FreeRecord's fix can be turned off:
 *   - FIX_WAIT=0 (the entry back at once, as before issue 16): a late write of one use lands after
 *     the next use on another QP (finding 3);
 *   - FIX_CLEAR=0 (the use marked done with its own seq, as before): a use whose entry was never
 *     written leaves d != seq beside the previous use's entry, which looks live again (found by
 *     this model; unit test "finding 3 (found by the records model)").
 * Either makes spin report a ticket released twice; with both on it finds none.
 *
 * Run: spin -a records.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan
 */
#ifndef NT
#define NT 2
#endif
#ifndef USES
#define USES 2
#endif
/* The two fixes of issue 16, finding 3 (both on by default; turn one off to see its hole). */
#ifndef FIX_WAIT
#define FIX_WAIT 1
#endif
#ifndef FIX_CLEAR
#define FIX_CLEAR 1
#endif
/* A ticket granted while it was given up writes its entry again (2026-12-03); 0: as before. */
#ifndef REARM
#define REARM 1
#endif
#define QCAP 8  /* a use posts up to 5 operations, and may find 2 of the last one still queued */
#define MAXTK 8

byte e_seq, e_tkt, d_seq;  /* the entry: word a = (seq, ticket), word d = the done seq */
bool e_free = true;        /* the entry is in the pool */
byte next_seq = 1;
byte mS, nS;               /* the slot's shared counters */
bool released[MAXTK];      /* ghost: tickets released so far */
bool fenced;               /* lockd ended the session */

chan q[NT] = [QCAP] of { byte, byte, byte };  /* posted operations: kind, arg1, arg2 */

inline land(kind, a1, a2) {
  if
  :: kind == 1 -> e_seq = a1; e_tkt = a2
  :: kind == 2 -> d_seq = a1
  :: kind == 3 -> assert(!released[a1]); released[a1] = true; nS++
  :: kind == 4 -> e_seq = 0; e_tkt = 0; d_seq = 0
  fi
}

proctype Thread(byte me) {
  byte s, k, uses = 0;
end:
  do
  :: uses >= USES || fenced -> break
  :: atomic { uses < USES && e_free && !fenced -> e_free = false; s = next_seq; next_seq++ };
     uses++;
     if
     :: atomic { k = mS; mS++ };  /* FETCH_AND_ADD: a shared ticket, granted at once */
        q[me]!1,s,k;              /* the entry, posted after the FA */
        q[me]!2,s,0;              /* the release: the done mark first ... */
        q[me]!3,k,0;              /* ... then the CAS */
        (len(q[me]) == 0 || fenced);  /* its completion */
        e_free = true
     :: /* Granted while giving up (a try or a timeout whose holder released meanwhile): the
         * withdrawal's doorbell marks the entry done, its CAS misses, and the ticket turns out
         * granted. With REARM the grant writes its entry again as a new use, seq + 64 (the SDK's
         * RearmSeq: a seq no other use has), and its release marks that use done. */
        atomic { k = mS; mS++ };
        q[me]!1,s,k;                  /* the entry, posted after the FA */
        q[me]!2,s,0;                  /* the withdrawal's done mark (its CAS misses) */
        if
        :: REARM -> q[me]!1,s + 64,k;  /* the entry again, as a new use */
                    q[me]!2,s + 64,0   /* the release's done mark ... */
        :: !REARM -> q[me]!2,s,0       /* before: the release marks the old use again */
        fi;
        q[me]!3,k,0;                  /* ... then the release CAS */
        (len(q[me]) == 0 || fenced);
        e_free = true
     :: /* No grant: a busy try, a timeout or a lapsed lease. Either the FA drew a ticket and
         * the entry was written, then the ticket was withdrawn (its number goes to the next
         * requester), or the FA bounced off a frozen word and nothing was written. */
        if
        :: atomic { k = mS; mS++ }; q[me]!1,s,k; atomic { mS-- }
        :: skip
        fi;
        if
        :: FIX_CLEAR -> q[me]!4,0,0   /* the entry cleared (LockEngine::FreeRecord) */
        :: !FIX_CLEAR -> q[me]!2,s,0  /* before: a done mark with this use's seq */
        fi;
        if
        :: FIX_WAIT -> (len(q[me]) == 0 || fenced)  /* waited for before the entry goes back */
        :: !FIX_WAIT -> skip                         /* before: back at once */
        fi;
        e_free = true
     fi
  od
}

proctype Net() {
  byte kind, a1, a2;
end:
  do
  :: atomic { !fenced && nempty(q[0]) -> q[0]?kind,a1,a2; land(kind, a1, a2) }
  :: atomic { !fenced && nempty(q[1]) -> q[1]?kind,a1,a2; land(kind, a1, a2) }
  :: fenced -> break
  od
}

proctype Lockd() {
  atomic {
    fenced = true;  /* every QP to the error state: what has not landed never will */
    if
    :: e_seq != 0 && d_seq != e_seq ->  /* a live entry: lockd releases its ticket */
       assert(!released[e_tkt]); released[e_tkt] = true; nS++
    :: else -> skip
    fi
  }
}

init {
  atomic {
    run Net();
    run Thread(0);
    run Thread(1);
    run Lockd()
  }
}
