/*
 * A Promela model of rdmalock's lock-word protocol (docs/protocol.md), checked with spin.
 *
 * What it models: one 16-byte slot (word0 = nX, nS, maxX, maxS; word1 = generation * RMOD + renew)
 * and NCLIENTS clients that each take the lock ROUNDS times in a mode chosen non-deterministically:
 * acquire (FETCH_AND_ADD), immediate grant, waiting by READ (word0 and word1 read in two separate
 * steps, as a 16-byte READ is not one atomic snapshot), the pause rule, stall recovery by CAS,
 * frozen-word withdrawal and rescue, counter reset by whoever drains a frozen word, renewal with
 * loss detection, release with the skipped-grant check and undo, fencing tokens, and a waiter's
 * give-up (a try-lock or a timeout: withdrawn when last and its FA did not freeze the word, else
 * left to the reaper, which waits for its turn and releases it).
 *
 * Abstractions and bounds:
 *  - Time is a global tick counter advanced by its own process up to TMAX. A lease is L ticks and
 *    a stall F x L ticks. All clients' clocks run at the same rate (the protocol's assumption).
 *    A READ is issued at one tick (the lease start it records) and completes at a later one (the
 *    stall timer starts at completion, after both words were read).
 *  - Each remote operation (FA, CAS, one word of a READ) is one atomic step. Times a client records
 *    (lease starts, stall timers) are taken in the step that lands the operation, which is later
 *    than the engine takes them (before posting): the engine is the more conservative. A release
 *    or renewal checks the lease in one step and lands its operation in a later one, so time may
 *    pass in between (a paused process, a delayed operation).
 *  - A CAS retry loop whose condition is re-evaluated on the value it finds is one atomic step.
 *  - A crash, and a pause, of any client at any step needs no code: the checker explores every
 *    schedule, including those in which a client never moves again or waits while time passes.
 *  - COUNT_MAX is CMAX (small) so that freezing and resets happen within the bounds.
 *  - A client bounces off a frozen word at most MAXBOUNCE times per round, then gives up as at a
 *    deadline (the engine backs off randomly between bounces; without that, two bouncers can keep
 *    defeating each other's reset CAS, each bumping the generation: harmless but unbounded).
 *
 * Properties (assertions):
 *  - mutual exclusion among lease-valid holders: when a client observes its grant, no other client
 *    holds a conflicting grant whose lease is still running; and at every step (the Exclusion
 *    process), so that a lease a renewal extends is checked too;
 *  - no counter carries or runs ahead: nX <= maxX, nS <= maxS, counters below 2 x CMAX + NCLIENTS;
 *  - a frozen word never thaws before its reset (the Thaw process): the frozen-word rescue's
 *    safety rests on it (docs/protocol.md section 5);
 *  - fencing tokens of successive exclusive grants (observed while lease-valid) strictly increase;
 *  - no invalid end state (spin's deadlock check).
 */

#ifndef NCLIENTS
#define NCLIENTS 3
#endif
#ifndef CMAX
#define CMAX 3
#endif
#ifndef TMAX
#define TMAX 9
#endif
#ifndef ROUNDS
#define ROUNDS 2
#endif
#ifndef MAXBOUNCE
#define MAXBOUNCE 2
#endif
#ifndef TIMER_AT_ISSUE
#define TIMER_AT_ISSUE 0  /* 1: a mutant (check.sh): the stall timer starts at the READ's issue */
#endif
#ifndef NO_RENEW_CHECK
#define NO_RENEW_CHECK 0  /* 1: a mutant (check.sh): a renewal checks neither lease nor word */
#endif
#ifndef RESET_EARLY
#define RESET_EARLY 0  /* 1: a mutant (check.sh): reset with the frozen field's last ticket held */
#endif
#ifndef THAW
#define THAW 0  /* 1: a mutant (check.sh): the ticket whose FA froze the word may withdraw */
#endif
#define L 2
#define F 2
#define RMOD 2

byte nX, nS, mX, mS;   /* word0 */
byte w1;               /* word1 */
byte t;                /* time */

/* ghost state for the properties */
bool holding[NCLIENTS];
bool hx[NCLIENTS];
byte lease_end[NCLIENTS];
int last_token = -1;
/* Resets so far. Ticket numbers restart at every reset; in the real word a delayed operation can
 * only be fooled by a recurring ticket after COUNT_MAX = 32768 further grants. The model's CMAX is
 * tiny, so it states that bound as an assumption: a release or renewal check never matches a word
 * of a later generation than its grant's (see docs/protocol.md, residual risk). */
byte resets;

#define FROZEN(x, s) ((x) >= CMAX || (s) >= CMAX)
#define CONFLICT(i, j) (hx[i] || hx[j])

/* Mutual exclusion at the moment client `me` observes its grant, with lease_start `ls`. */
inline observe_grant(me, ls) {
  j = 0;
  hx[me] = x;
  do
  :: j < NCLIENTS ->
     assert(j == me || !(holding[j] && lease_end[j] > t && CONFLICT(me, j)));
     j++
  :: else -> break
  od;
  holding[me] = true;
  lease_end[me] = ls + L;
  myresets = resets;
  j = 0
}

/* A word this client just produced is frozen with nothing but bounces left in it (the frozen
 * field's CMAX admitted tickets all released, the other field drained; Word0::Resettable, whose
 * == is >= here: n never passes CMAX): bump the generation, then CAS to 0. */
#define RESETTABLE(x, s, nx, ns) (((x) >= CMAX && (nx) >= CMAX - RESET_EARLY && (ns) == (s)) || \
                                  ((s) >= CMAX && (ns) >= CMAX - RESET_EARLY && (nx) == (x)))
inline reset_if_drained(cx, cs, cnx, cns) {
  if
  :: RESETTABLE(cx, cs, cnx, cns) ->
     atomic { w1 = w1 + RMOD };
     atomic {
       if
       :: nX == cnx && nS == cns && mX == cx && mS == cs -> nX = 0; nS = 0; mX = 0; mS = 0; resets++
       :: else -> skip
       fi
     }
  :: else -> skip
  fi
}

proctype Client(byte id) {
  byte rounds = 0;
  bool x;
  byte px, ps, pnx, pns;          /* the ticket: word0 as the FA found it */
  byte r0x, r0s, r0nx, r0ns, r1;  /* last READ */
  byte issue, rdone, last_issue, seen_since, last_renew;
  byte sx, ss, sw;
  bool seen, ok;
  byte g;
  byte cx, cs, cnx, cns;
  byte fx, fs, fw, fsince;        /* frozen-word rescue watch */
  bool fseen;
  byte j;
  byte bounces;
  byte myresets;
  bool gaveup;                    /* one give-up per round, to bound the search */
  byte bres;                      /* resets when our FA landed */

start:
  issue = 0; last_issue = 0; last_renew = 0; px = 0; ps = 0; pnx = 0; pns = 0; g = 0;
  if
  :: rounds < ROUNDS -> rounds++
  :: else -> goto finished
  fi;
  if
  :: x = true
  :: x = false
  fi;
  fseen = false;
  bounces = 0;
  gaveup = false;

acquire:
  r0x = 0; r0s = 0; r0nx = 0; r0ns = 0; r1 = 0; rdone = 0; cx = 0; cs = 0; cnx = 0; cns = 0;
  sx = 0; ss = 0; sw = 0; seen_since = 0; g = 0;
  atomic {
    issue = t;
    pnx = nX; pns = nS; px = mX; ps = mS; bres = resets;
    if
    :: x -> mX++
    :: else -> mS++
    fi;
    if
    :: !FROZEN(px, ps) && ((x && pnx == px && pns == ps) || (!x && pnx == px)) ->
       observe_grant(id, issue); ok = true
    :: else -> ok = false
    fi
  }
  if
  :: ok -> last_issue = issue; atomic { g = w1 / RMOD }; goto granted_token
  :: else -> skip
  fi;

  if
  :: FROZEN(px, ps) ->
     /* withdraw our increment, unless a reset already removed it (the engine retries a missed
      * withdrawal only within kFreshWithdrawal of its FA, too soon for a reset and a refill:
      * the model assumes a withdrawal never lands in a later generation, as releases do) */
     atomic {
       if
       :: resets == bres && FROZEN(mX, mS) && ((x && mX > 0) || (!x && mS > 0)) ->
          if
          :: x -> mX--
          :: else -> mS--
          fi;
          cx = mX; cs = mS; cnx = nX; cns = nS; ok = true
       :: else -> ok = false
       fi
     }
     if
     :: ok -> reset_if_drained(cx, cs, cnx, cns)
     :: else -> skip
     fi;
     /* watch for a frozen word nobody resets */
     atomic { issue = t; r0nx = nX; r0ns = nS; r0x = mX; r0s = mS };
     atomic { r1 = w1; rdone = t };
     if
     :: FROZEN(r0x, r0s) ->
        if
        :: !fseen || fx != r0nx || fs != r0ns || fw != r1 ->
           fseen = true; fx = r0nx; fs = r0ns; fw = r1; fsince = rdone
        :: else ->
           if
           :: rdone - fsince >= F * L ->
              atomic { w1 = w1 + RMOD };
              atomic {
                if
                :: nX == r0nx && nS == r0ns && mX == r0x && mS == r0s ->
                   nX = 0; nS = 0; mX = 0; mS = 0; resets++
                :: else -> skip
                fi
              };
              fseen = false
           :: else -> skip
           fi
        fi
     :: else -> skip
     fi;
     /* the engine backs off between bounces and gives up at its deadline: bound the retries */
     bounces++;
     if
     :: bounces <= MAXBOUNCE -> goto acquire
     :: else -> goto start
     fi
  :: else -> skip
  fi;

  last_issue = issue;
  seen = false;
wait:
  if
  :: t - last_issue > L -> goto acquire  /* paused longer than a lease: the ticket is untrusted */
  :: else -> skip
  fi;
  /* Giving up (a try-lock, a timeout): the CAS withdraws the ticket only while it is neither
   * granted nor skipped, nothing queued behind it (the max fields are ours plus our increment),
   * and its FA did not freeze the word. Otherwise it is abandoned: the reaper waits for its turn
   * and releases it, which this client's own waiting, grant and release stand for. */
  if
  :: !gaveup ->
     gaveup = true;
     atomic {
       if
       :: !((x && nX == px && nS == ps) || (!x && nX == px)) &&
          !((x && (nX > px || nS > ps)) || (!x && nX > px)) &&
          ((x && mX == px + 1 && mS == ps) || (!x && mX == px && mS == ps + 1)) &&
          (THAW || !((x && FROZEN(px + 1, ps)) || (!x && FROZEN(px, ps + 1)))) ->
          if
          :: x -> mX--
          :: else -> mS--
          fi;
          ok = true
       :: else -> ok = false
       fi
     }
     if
     :: ok -> goto start
     :: else -> skip
     fi
  :: true -> skip
  fi;
  atomic {
    issue = t; r0nx = nX; r0ns = nS; r0x = mX; r0s = mS;
    if
    :: (x && r0x <= px) || (!x && r0s <= ps) -> ok = false       /* gone */
    :: else ->
       if
       :: (x && r0nx == px && r0ns == ps) || (!x && r0nx == px) ->
          observe_grant(id, last_issue); ok = true
       :: else -> ok = false
       fi
    fi
  }
  atomic { r1 = w1; rdone = t };
  if
  :: ok -> g = r1 / RMOD; goto granted_token
  :: (x && r0x <= px) || (!x && r0s <= ps) -> goto acquire
  :: (x && (r0nx > px || r0ns > ps)) || (!x && r0nx > px) -> goto acquire   /* skipped */
  :: else -> skip
  fi;
  last_issue = issue;
  if
  :: !seen || sx != r0nx || ss != r0ns || sw != r1 ->
     seen = true; sx = r0nx; ss = r0ns; sw = r1;
     if
     :: TIMER_AT_ISSUE -> seen_since = issue
     :: else -> seen_since = rdone
     fi
  :: else ->
     if
     :: rdone - seen_since >= F * L ->
        atomic {
          if
          :: nX == r0nx && nS == r0ns && mX == r0x && mS == r0s ->
             if
             :: x -> nX = px + 1; nS = ps
             :: else -> nX = px; nS = r0ns + 1
             fi;
             cx = mX; cs = mS; cnx = nX; cns = nS; ok = true
          :: else -> ok = false
          fi
        }
        if
        :: ok -> reset_if_drained(cx, cs, cnx, cns); goto acquire
        :: else -> seen = false
        fi
     :: else -> skip
     fi
  fi;
  goto wait;

granted_token:
  atomic {
    if
    :: x && lease_end[id] > t ->
       assert(g * 64 + px > last_token);
       last_token = g * 64 + px
    :: else -> skip
    fi
  }
  r0x = 0; r0s = 0; r0nx = 0; r0ns = 0; r1 = 0; rdone = 0; sx = 0; ss = 0; sw = 0;
  seen_since = 0; seen = false; fseen = false; fx = 0; fs = 0; fw = 0; fsince = 0;
  last_renew = t;

hold:
  if
  :: t > last_renew ->
     /* renew: the lease is checked and the issue time taken; the FA on word1 and the READ of
      * word0 land later, in that order */
     atomic {
       if
       :: NO_RENEW_CHECK || t < lease_end[id] -> issue = t; ok = true
       :: else -> ok = false
       fi
     }
     last_renew = issue;
     if
     :: !ok -> holding[id] = false; goto start   /* lost */
     :: else -> skip
     fi;
     atomic { w1 = w1 + 1 };
     atomic {
       if
       :: NO_RENEW_CHECK ||
          (resets == myresets && ((x && nX == px && nS == ps) || (!x && nX == px)) &&
           ((x && mX > px) || (!x && mS > ps))) -> lease_end[id] = issue + L; ok = true
       :: else -> holding[id] = false; ok = false
       fi
     }
     if
     :: ok -> goto hold
     :: else -> goto start  /* recovered by a waiter: lost */
     fi
  :: true -> skip   /* release */
  fi;

  /* release: the lease is checked, then the CAS is posted; it may land any time later (a paused
   * process, a retransmission). The critical section ends at the check. */
  atomic {
    ok = t < lease_end[id];
    holding[id] = false
  }
  if
  :: !ok -> goto start   /* lease over: lost, nothing released */
  :: else -> skip
  fi;
  /* the CAS loop, landing now: only while the word still shows our grant */
  atomic {
    if
    :: resets == myresets &&
       ((x && nX == px && nS == ps && mX > px) || (!x && nX == px && mS > ps && nS < mS)) ->
       if
       :: x -> nX++
       :: else -> nS++
       fi;
       cx = mX; cs = mS; cnx = nX; cns = nS; ok = true
    :: else -> ok = false   /* recovered by a waiter meanwhile: lost, nothing released */
    fi
  }
  if
  :: ok -> reset_if_drained(cx, cs, cnx, cns)
  :: else -> skip
  fi;
  cx = 0; cs = 0; cnx = 0; cns = 0;
  goto start;

finished:
  skip
}

active proctype Clock() {
  do
  :: t < TMAX -> t++
  :: else -> break
  od
}

/* Mutual exclusion at every step: no two conflicting grants whose leases both run. */
#define BOTH(i, j) (holding[i] && holding[j] && lease_end[i] > t && lease_end[j] > t && CONFLICT(i, j))
active proctype Exclusion() {
end:
  atomic {
#if NCLIENTS >= 3
    (BOTH(0, 1) || BOTH(0, 2) || BOTH(1, 2)) ->
#else
    BOTH(0, 1) ->
#endif
    assert(false)
  }
}

/* A frozen word stays frozen until a reset: no admitted ticket leaves it, so no request is
 * admitted and nX, nS only grow until then, which the frozen-word rescue's safety rests on. */
active proctype Thaw() {
  byte r;
end0:
  do
  :: atomic { FROZEN(mX, mS) -> r = resets };
end1:
     atomic { (!FROZEN(mX, mS) || resets != r) -> assert(resets != r) }
  od
}

/* Counters never carry into a neighbour nor run ahead of the tickets issued. */
active proctype Counters() {
end:
  atomic {
    !(nX <= mX && nS <= mS && mX < 2 * CMAX + NCLIENTS && mS < 2 * CMAX + NCLIENTS) ->
    assert(false)
  }
}

init {
  byte i = 0;
  atomic {
    do
    :: i < NCLIENTS -> run Client(i); i++
    :: else -> break
    od
  }
}
